"""Rules that live in one function but must also be spelled out where no
function may be called: the claim indexes' predicates (an index cannot depend
on a function the migrations drop and recreate) and the run_stats view (a
view runs its functions with the reader's privileges, and the admin role may
execute no internal helper). These tests prove each spelled-out copy agrees
with the rule's home, so a change to one that misses the other fails here.
Also: the runnable rule is inlined by the planner (or the claim indexes
could not serve the claim queries), attempts.outcome is checked, and the
wait HINT is built from the table of wait kinds."""

from __future__ import annotations

import psycopg
import pytest

from runrelay.contract import RUN_STATUSES

CLAIM_INDEXES = ("runs_claim_queue_idx", "runs_claim_any_idx")


def runnable(db: psycopg.Connection, status: str, key_held: bool, at: str, now: str) -> bool:
    row = db.execute(
        "SELECT runrelay._runnable(%s, %s, %s::timestamptz, %s::timestamptz)",
        [status, key_held, at, now],
    ).fetchone()
    assert row is not None
    return bool(row[0])


def row_rule(db: psycopg.Connection, table: str, rule: str) -> str:
    """The condition of one row rule of `table`: its arm in the table's rules
    function (the CHECK constraint `<table>_rules` calls it; 02_runs.sql)."""
    row = db.execute(
        "SELECT p.prosrc FROM pg_proc AS p"
        " JOIN pg_depend AS d ON d.refobjid = p.oid AND d.refclassid = 'pg_proc'::regclass"
        " JOIN pg_constraint AS c ON c.oid = d.objid AND d.classid = 'pg_constraint'::regclass"
        " WHERE c.conname = %s AND c.conrelid = %s::regclass",
        [f"{table}_rules", f"runrelay.{table}"],
    ).fetchone()
    assert row is not None, f"no {table}_rules constraint calling a rules function"
    head = row[0][: row[0].index(f"THEN '{rule}'")]
    return head[head.rindex("WHEN NOT") :]


def test_run_statuses_are_the_ones_the_schema_allows(db: psycopg.Connection) -> None:
    # The tests below enumerate these statuses; a new status must be added.
    rule = row_rule(db, "runs", "runs_status")
    assert sorted(s for s in RUN_STATUSES if f"'{s}'" in rule) == sorted(RUN_STATUSES)
    assert rule.count("'") == 2 * len(RUN_STATUSES)


@pytest.mark.parametrize("index", CLAIM_INDEXES)
def test_claim_index_predicate_is_the_runnable_rule(db: psycopg.Connection, index: str) -> None:
    """For every status and key_held, the index predicate admits a row iff
    _runnable does when the row is due: the index holds exactly the rule's
    time-independent part (the time is the claim's index condition)."""
    row = db.execute(
        "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i"
        " WHERE i.indexrelid = %s::regclass",
        [f"runrelay.{index}"],
    ).fetchone()
    assert row is not None and row[0], f"{index} has no predicate"
    predicate = row[0]
    for status in RUN_STATUSES:
        for key_held in (False, True):
            got = db.execute(
                f"SELECT {predicate}"
                " FROM (SELECT %s::text AS status, %s::boolean AS key_held) AS r",
                [status, key_held],
            ).fetchone()
            assert got is not None
            due = runnable(db, status, key_held, "2000-01-01", "2000-01-02")
            assert bool(got[0]) == due, (index, status, key_held, predicate)
    # And the rule's time condition: a run not yet due is not runnable.
    assert not runnable(db, "queued", False, "2000-01-02", "2000-01-01")


def test_runnable_is_inlined_into_the_claim_indexes(db: psycopg.Connection) -> None:
    """The claim queries say _runnable(...); only if the planner inlines it can
    a partial claim index serve them (a function call proves nothing about
    the index predicate). Sequential scans are disabled so the plan shows
    whether an index is usable at all, whatever the statistics."""
    with db.transaction():
        db.execute("SET LOCAL enable_seqscan = off")
        for query, index in (
            (
                "SELECT r.run_id FROM runrelay.runs AS r"
                " WHERE runrelay._runnable(r.status, r.key_held, r.run_at, now())"
                " ORDER BY r.priority DESC, r.run_at LIMIT 1",
                "runs_claim_any_idx",
            ),
            (
                "SELECT r.run_id FROM runrelay.runs AS r"
                " WHERE r.queue = 'q' AND runrelay._runnable(r.status, r.key_held, r.run_at, now())"
                " ORDER BY r.priority DESC, r.run_at LIMIT 1",
                "runs_claim_queue_idx",
            ),
        ):
            plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + query).fetchall())
            # Either partial claim index proves the predicate was matched; which
            # one the planner prefers depends on the statistics at hand.
            assert any(f"using {i} on runs" in plan for i in CLAIM_INDEXES), (index, plan)
            assert "_runnable" not in plan, plan


def test_run_stats_counts_runnable_runs_as_the_rule_does(db: psycopg.Connection) -> None:
    """One queue per (status, key_held, due): run_stats reports an oldest
    runnable age exactly for the queues whose run _runnable admits, and an
    oldest_run_at exactly for those it admits at some time."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, concurrency_key, key_position, key_held,
                                   payload, run_at, max_attempts, attempt_count, wait, result,
                                   created_at, updated_at, finished_at)
        SELECT s.status || '-' || h.held || '-' || d.due, s.status || '-' || h.held || '-' || d.due,
               s.status,
               CASE WHEN h.held THEN 'key-' || s.status || '-' || d.due END,
               CASE WHEN h.held THEN nextval('runrelay.runs_key_position_seq') END,
               h.held, '{}',
               CASE WHEN d.due THEN now() - interval '1 hour' ELSE now() + interval '1 hour' END,
               3,
               CASE WHEN s.status IN ('running', 'waiting') THEN 1 ELSE 0 END,
               CASE WHEN s.status = 'waiting' THEN '{"kind": "event", "name": "n"}'::jsonb END,
               CASE WHEN s.status = 'completed' THEN '{}'::jsonb END,
               now(), now(),
               CASE WHEN s.status IN ('completed', 'failed', 'cancelled') THEN now() END
        FROM unnest(%s::text[]) AS s (status)
        CROSS JOIN (VALUES (FALSE), (TRUE)) AS h (held)
        CROSS JOIN (VALUES (FALSE), (TRUE)) AS d (due)
        WHERE NOT h.held OR s.status = 'queued'
        """,
        [list(RUN_STATUSES)],
    )
    rows = db.execute(
        """
        SELECT s.queue, r.status, r.key_held, r.run_at,
               s.oldest_runnable_age_seconds IS NOT NULL, s.oldest_run_at IS NOT NULL,
               runrelay._runnable(r.status, r.key_held, r.run_at, statement_timestamp()),
               runrelay._runnable(r.status, r.key_held, r.run_at, 'infinity')
        FROM runrelay.run_stats AS s
        INNER JOIN runrelay.runs AS r ON r.queue = s.queue
        """
    ).fetchall()
    assert len(rows) == len(RUN_STATUSES) * 2 + 2
    for queue, _, _, _, has_age, has_oldest, rule_now, rule_ever in rows:
        assert has_age == rule_now, queue
        assert has_oldest == rule_ever, queue
    assert sum(1 for r in rows if r[6]) == 1  # queued, not held, due


def test_attempts_outcome_takes_only_the_outcomes_the_engine_writes(
    db: psycopg.Connection,
) -> None:
    db.execute(
        "INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,"
        " attempt_count, created_at, updated_at)"
        " VALUES ('o1', 'q', 'running', '{}', now(), 3, 1, now(), now())"
    )
    db.execute(
        "INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at,"
        " lease_expires_at) VALUES ('o1', 1, 'w', gen_random_uuid(), 'running', now(), now())"
    )
    for outcome in (
        "completed",
        "retry_scheduled",
        "failed",
        "cancelled",
        "waiting",
        "resumed",
        "released",
    ):
        db.execute(
            "UPDATE runrelay.attempts SET outcome = %s, outcome_op = 'x' WHERE run_id = 'o1'",
            [outcome],
        )
    for bad in ("fence_lost", "superseded", "Completed", ""):
        with pytest.raises(psycopg.errors.CheckViolation, match="attempts_outcome"):
            db.execute(
                "UPDATE runrelay.attempts SET outcome = %s, outcome_op = 'x' WHERE run_id = 'o1'",
                [bad],
            )


def test_a_bad_wait_is_answered_with_every_wait_shape(db: psycopg.Connection) -> None:
    """The HINT is built from the table of wait kinds; it is the text it was
    when it was written by hand."""
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        db.execute(
            "SELECT runrelay.suspend_attempt('r', 1, gen_random_uuid(), '{\"kind\": \"nap\"}')"
        )
    assert caught.value.diag.message_hint == (
        'Pass {"kind":"sleep","until":ts}, {"kind":"event","name":n,"timeout_at":ts?} '
        'or {"kind":"detached_runner","runner":r,"timeout_at":ts?}.'
    )


def test_stats_views_read_the_clock_every_function_reads(db: psycopg.Connection) -> None:
    """run_stats and ledger_stats read the _clock view, so a shifted test
    clock moves their ages exactly as it moves _now(), and the admin role,
    which may execute no helper, can still read them."""
    db.execute(
        """INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                      attempt_count, created_at, updated_at)
           VALUES ('clock-run', 'clock', 'queued', '{}', now() - interval '10 seconds', 3, 0,
                   now(), now())"""
    )
    db.execute(
        """INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                               created_at, next_attempt_at)
           VALUES ('clock-run', 'observability', 1, 't', '{}', 'clock-run:1',
                   now() - interval '10 seconds', now())"""
    )
    ages = """SELECT (SELECT s.oldest_runnable_age_seconds FROM runrelay.run_stats AS s
                      WHERE s.queue = 'clock'),
                     (SELECT s.oldest_pending_age_seconds FROM runrelay.ledger_stats AS s
                      WHERE s.lane = 'observability' AND s.state = 'pending')"""
    with db.transaction():
        db.execute("SET LOCAL ROLE runrelay_admin")
        unshifted = db.execute(ages).fetchone()
        db.execute("SET LOCAL runrelay.clock_offset = '1 hour'")
        shifted = db.execute(ages).fetchone()
    assert unshifted is not None and shifted is not None
    for before, after in zip(unshifted, shifted, strict=True):
        assert 10 <= before < 60
        assert after - before == pytest.approx(3600, abs=5)
