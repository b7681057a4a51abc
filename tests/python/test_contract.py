"""runrelay.contract against an installed schema: each value the package and
the SQL must agree on, read from its home in the SQL. A status, lane, wait
kind, channel or lease bound changed on one side only fails here."""

from __future__ import annotations

import re

import psycopg
import pytest

from runrelay import contract


def _rule(db: psycopg.Connection, rule: str) -> str:
    """The condition of one arm of the runs table's rules function."""
    row = db.execute(
        "SELECT p.prosrc FROM pg_proc AS p"
        " WHERE p.proname = '_runs_rules' AND p.pronamespace = 'runrelay'::regnamespace"
    ).fetchone()
    assert row is not None
    head = row[0][: row[0].index(f"THEN '{rule}'")]
    return head[head.rindex("WHEN NOT") :]


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([a-z_]+)'", text))


def test_run_statuses_and_the_terminal_ones_are_the_schemas(db: psycopg.Connection) -> None:
    assert _quoted(_rule(db, "runs_status")) == set(contract.RUN_STATUSES)
    assert _quoted(_rule(db, "runs_finished_iff_terminal")) == set(contract.TERMINAL_STATUSES)
    # The functions' own rule, _terminal, says the same of every status.
    for status in contract.RUN_STATUSES:
        row = db.execute("SELECT runrelay._terminal(%s)", [status]).fetchone()
        assert row == (status in contract.TERMINAL_STATUSES,), status


def test_lanes_are_the_ones_check_lane_takes(db: psycopg.Connection) -> None:
    for lane in contract.LANES:
        db.execute("SELECT runrelay._check_lane(%s)", [lane])
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match="Pass lifecycle or observability"
    ):
        db.execute("SELECT runrelay._check_lane('other')")
    assert "Pass " + " or ".join(contract.LANES) + "." == "Pass lifecycle or observability."


def test_wait_kinds_are_the_rows_of_wait_kinds(db: psycopg.Connection) -> None:
    rows = db.execute("SELECT w.kind FROM runrelay._wait_kinds() AS w ORDER BY w.kind").fetchall()
    assert [kind for (kind,) in rows] == sorted(contract.WAIT_KINDS)


def test_channels_are_named_as_sql_names_them(db: psycopg.Connection) -> None:
    for kind in contract.CHANNEL_KINDS:
        row = db.execute("SELECT runrelay._channel(%s)", [kind]).fetchone()
        assert row == (contract.channel("runrelay", kind),)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT runrelay._channel('other')")
    with pytest.raises(ValueError, match="no NOTIFY channel of kind 'other'"):
        contract.channel("runrelay", "other")


def test_lease_bounds_and_default_are_the_ones_lease_applies(db: psycopg.Connection) -> None:
    row = db.execute(
        "SELECT extract(epoch FROM runrelay._lease(NULL))::integer,"
        " extract(epoch FROM runrelay._lease(-1))::integer,"
        " extract(epoch FROM runrelay._lease(100000))::integer"
    ).fetchone()
    assert row == (
        contract.LEASE_SECONDS_DEFAULT,
        contract.LEASE_SECONDS_MIN,
        contract.LEASE_SECONDS_MAX,
    )


def test_reasons_are_capped_where_check_reason_caps_them(db: psycopg.Connection) -> None:
    db.execute("SELECT runrelay._check_reason('reason', %s)", ["x" * contract.REASON_CHARS])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 2000"):
        db.execute(
            "SELECT runrelay._check_reason('reason', %s)", ["x" * (contract.REASON_CHARS + 1)]
        )
