"""The operators' commands (`runrelay runs|ledger|queues`, `status --watch`)
against a real server: each finds or changes what it says, prints JSON a
script can read with --json, and answers with the documented exit code —
0 done, 1 refused, 2 bad usage or input, 3 unreachable, 4 not found — with
nothing changed when it refuses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import REPO
from runrelay import Client
from runrelay.cli import main
from sqlapi import run_row, table_checksum

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db: psycopg.Connection, db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run `runrelay ARGS` in this process against the test database:
    (exit code, stdout, stderr)."""

    def run(*args: str, url: str = db_url) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(["--database-url", url, *args])
        except SystemExit as exited:  # argparse's usage errors
            code = int(exited.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def client(db: psycopg.Connection) -> Client:
    return Client(db)


def as_json(cli: Cli, *args: str) -> Any:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _fail_for_good(client: Client, run_id: str, queue: str = "default") -> None:
    client.enqueue_run(run_id, queue=queue, max_attempts=1, priority=100)  # claimed first
    (attempt,) = client.claim_attempts("w", [queue])
    assert attempt.run_id == run_id
    assert client.fail_attempt(**attempt.fence, error={"message": "card declined"}) == "failed"


def _blocked(client: Client, run_id: str) -> int:
    """A run whose lifecycle lane is blocked behind its failed head: the event id."""
    client.enqueue_run(run_id)
    (head,) = client.claim_ledger("relay-1", run_id=run_id)
    (failure,) = client.fail_ledger(
        "relay-1", [head.event_id], {"message": "410 Gone"}, permanent=True
    )
    assert failure.outcome == "blocked"
    return head.event_id


# -- runs list ---------------------------------------------------------------
def test_runs_list_filters_and_pages_newest_first(cli: Cli, client: Client) -> None:
    for i in range(5):
        client.enqueue_run(f"mail-{i}", queue="email")
    client.enqueue_run("inv-1", queue="billing", concurrency_key="acct-7")
    _fail_for_good(client, "inv-2", queue="billing")

    everything = as_json(cli, "runs", "list")
    assert [r["run_id"] for r in everything][:2] == ["inv-2", "inv-1"]
    assert len(everything) == 7

    failed = as_json(cli, "runs", "list", "--status", "failed")
    assert [(r["run_id"], r["error"]["message"]) for r in failed] == [("inv-2", "card declined")]
    assert [r["run_id"] for r in as_json(cli, "runs", "list", "--key", "acct-7")] == ["inv-1"]
    assert len(as_json(cli, "runs", "list", "--queue", "email")) == 5
    assert as_json(cli, "runs", "list", "--created-before", "1h") == []
    assert len(as_json(cli, "runs", "list", "--created-after", "1h")) == 7

    # A full page says, on stderr, how to ask for the next one.
    code, out, err = cli("runs", "list", "--queue", "email", "--limit", "2")
    assert code == 0 and "mail-4" in out and "mail-3" in out and "mail-2" not in out
    assert "next page: --after-created-at" in err
    first = as_json(cli, "runs", "list", "--queue", "email", "--limit", "2")
    last = first[-1]
    second = as_json(
        cli, "runs", "list", "--queue", "email", "--limit", "2",
        "--after-created-at", last["created_at"], "--after-run-id", last["run_id"],
    )  # fmt: skip
    assert [r["run_id"] for r in first + second] == ["mail-4", "mail-3", "mail-2", "mail-1"]
    # --all follows the pages to the end.
    every = as_json(cli, "runs", "list", "--queue", "email", "--limit", "2", "--all")
    assert [r["run_id"] for r in every] == [f"mail-{i}" for i in (4, 3, 2, 1, 0)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "list", "--limit", "0"], "must be at least 1"),
        (["runs", "list", "--limit", "1001"], "at most 1000"),
        (["runs", "list", "--status", "lost"], "invalid choice"),
        (["runs", "list", "--created-after", "yesterday"], "not a timestamp or a duration"),
        (["runs", "list", "--after-run-id", "x"], "together"),
        (["runs", "enqueue", "r", "--payload", "{bad"], "not JSON"),
        (["ledger", "requeue"], "exactly one of"),
        (["ledger", "requeue", "1", "--all"], "exactly one of"),
        (["ledger", "requeue", "1", "--lane", "lifecycle"], "--lane goes with"),
        (["runs"], "ACTION"),
    ],
)
def test_bad_usage_is_one_line_exit_2_and_changes_nothing(
    cli: Cli, db: psycopg.Connection, client: Client, args: list[str], message: str
) -> None:
    client.enqueue_run("kept")
    before = table_checksum(db)
    code, out, err = cli(*args)
    assert (code, out) == (2, "")
    assert message in err
    assert table_checksum(db) == before


def test_an_argument_the_database_rejects_is_exit_2_and_changes_nothing(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    client.enqueue_run("inv-1", queue="billing", payload={"amount": 12})
    before = table_checksum(db)
    code, _, err = cli("runs", "enqueue", "new", "--max-attempts", "0")
    assert code == 2 and "max_attempts" in err and len(err.strip().splitlines()) == 1
    # The same run id with another payload: rejected, the first run kept.
    code, _, err = cli(
        "runs", "enqueue", "inv-1", "--queue", "billing", "--payload", '{"amount": 13}'
    )
    assert code == 2 and "different queue or payload" in err
    assert table_checksum(db) == before


# -- runs show -----------------------------------------------------------------
def test_runs_show_prints_the_run_its_attempts_and_its_ledger(cli: Cli, client: Client) -> None:
    _fail_for_good(client, "inv-9", queue="billing")
    shown = as_json(cli, "runs", "show", "inv-9")
    assert shown["run"]["status"] == "failed" and shown["run"]["queue"] == "billing"
    assert [(a["attempt"], a["status"]) for a in shown["attempts"]] == [(1, "failed")]
    types = [e["type"] for e in shown["events"]]
    assert types == ["run.queued", "run.started", "run.failed"]
    assert all(e["state"] == "pending" for e in shown["events"])

    code, out, _ = cli("runs", "show", "inv-9")
    assert code == 0
    for text in ("run inv-9", "attempts", "ledger events", "card declined", "run.failed"):
        assert text in out

    code, out, err = cli("runs", "show", "missing")
    assert (code, out) == (4, "")
    assert err.strip() == "runrelay runs show: no such run: 'missing'"


# -- acting on runs ------------------------------------------------------------------
def test_runs_enqueue_creates_once_and_reports_the_existing_run(
    cli: Cli, db: psycopg.Connection
) -> None:
    args = ("runs", "enqueue", "inv-1", "--queue", "billing", "--payload", '{"amount": 12}')
    code, out, _ = cli(*args, "--priority", "5", "--key", "acct-1", "--run-at", "10m")
    assert (code, out.strip()) == (0, "inv-1: enqueued, queued")
    run = run_row(db, "inv-1")
    assert (run["queue"], run["payload"], run["priority"]) == ("billing", {"amount": 12}, 5)
    assert run["concurrency_key"] == "acct-1"
    assert run["run_at"] > datetime.now(UTC) + timedelta(minutes=9)
    again = as_json(cli, *args)
    assert again == {"run_id": "inv-1", "status": "queued", "created": False}


def test_runs_cancel_answers_each_outcome_with_its_exit_code(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    client.enqueue_run("r1")
    assert as_json(cli, "runs", "cancel", "r1", "--reason", "duplicate order") == {
        "run_id": "r1",
        "outcome": "cancelled",
    }
    assert run_row(db, "r1")["status"] == "cancelled"
    # The reason outlives the marker that carried it: runs show says why.
    assert as_json(cli, "runs", "show", "r1")["run"]["cancel_reason"] == "duplicate order"
    assert "duplicate order" in cli("runs", "show", "r1")[1]
    assert cli("runs", "cancel", "r1")[:2] == (1, "r1: already_terminal\n")
    assert cli("runs", "cancel", "nope")[:2] == (4, "nope: not_found\n")


def test_runs_cancel_of_a_held_run_is_recorded_and_exit_0(
    cli: Cli, client: Client, connect: Callable[..., psycopg.Connection]
) -> None:
    """A worker's transaction holds the run: the cancel is recorded
    (cancel_requested), which is what was asked, so the exit code is 0."""
    client.enqueue_run("held")
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM runrelay.runs WHERE run_id = 'held' FOR UPDATE")
    try:
        assert cli("runs", "cancel", "held")[:2] == (0, "held: cancel_requested\n")
    finally:
        holder.rollback()


def test_runs_signal_resumes_stores_or_refuses(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    client.enqueue_run("approval")
    (attempt,) = client.claim_attempts("w")
    wait = {"kind": "event", "name": "approved"}
    assert client.suspend_attempt(**attempt.fence, wait=wait) == "waiting"
    args = ("runs", "signal", "approval", "approved", "--payload", '{"by": "ana"}')
    assert cli(*args)[:2] == (0, "approval: resumed\n")
    row = run_row(db, "approval")
    assert (row["status"], row["resume"]) == (
        "queued",
        {"name": "approved", "payload": {"by": "ana"}},
    )
    assert cli("runs", "signal", "approval", "later")[:2] == (0, "approval: stored\n")
    client.cancel_run("approval")
    assert cli("runs", "signal", "approval", "approved")[:2] == (1, "approval: terminal\n")
    assert cli("runs", "signal", "nope", "approved")[:2] == (4, "nope: not_found\n")


def test_runs_retry_queues_a_failed_run_again_and_refuses_a_live_one(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    _fail_for_good(client, "inv-3")
    answer = as_json(
        cli, "runs", "retry", "inv-3", "--reason", "card updated", "--requested-by", "ops@example",
        "--max-attempts", "2",
    )  # fmt: skip
    assert answer == {"run_id": "inv-3", "outcome": "retried"}
    row = run_row(db, "inv-3")
    assert (row["status"], row["max_attempts"]) == ("queued", 2)
    (retried,) = [e for e in client.run_ledger_events("inv-3") if e.type == "run.retried"]
    assert retried.payload["reason"] == "card updated"
    assert retried.payload["requested_by"] == "ops@example"

    before = table_checksum(db)
    assert cli("runs", "retry", "inv-3")[:2] == (1, "inv-3: not_retryable\n")
    assert cli("runs", "retry", "nope")[:2] == (4, "nope: not_found\n")
    assert table_checksum(db) == before


def test_runs_purge_deletes_ended_runs_and_keeps_undelivered_ones_unless_told(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    for i in range(3):
        _fail_for_good(client, f"old-{i}")
    client.enqueue_run("live")
    # Their events are not delivered (no relay ran): purging them would lose them.
    kept = as_json(cli, "runs", "purge", "--finished-before", "0s")
    assert kept["deleted"] == 0
    gone = as_json(cli, "runs", "purge", "--finished-before", "0s", "--include-undelivered",
                   "--batch", "2")  # fmt: skip
    assert gone["deleted"] == 3
    assert db.execute("SELECT array_agg(run_id) FROM runrelay.runs").fetchone() == (["live"],)


# -- ledger ---------------------------------------------------------------------------
def test_ledger_blocked_lists_failed_heads_and_requeue_unblocks_them(
    cli: Cli, db: psycopg.Connection, client: Client
) -> None:
    first = _blocked(client, "hook-1")
    _blocked(client, "hook-2")
    _blocked(client, "hook-3")
    heads = as_json(cli, "ledger", "blocked")
    assert [(h["run_id"], h["lane"], h["last_error"]) for h in heads] == [
        (f"hook-{i}", "lifecycle", {"message": "410 Gone"}) for i in (1, 2, 3)
    ]
    assert "410 Gone" in cli("ledger", "blocked")[1]
    assert [h["run_id"] for h in as_json(cli, "ledger", "blocked", "--run-id", "hook-2")] == [
        "hook-2"
    ]

    # One event by id; again: it is not blocked any more (1, nothing changed).
    assert cli("ledger", "requeue", str(first))[:2] == (0, f"{first}: requeued\n")
    before = table_checksum(db)
    code, out, _ = cli("ledger", "requeue", str(first))
    assert code == 1 and "nothing requeued" in out
    assert table_checksum(db) == before

    # A run's lanes, then every blocked lane.
    lanes = as_json(cli, "ledger", "requeue", "--run-id", "hook-2")
    assert [(x["run_id"], x["lane"], x["requeued"]) for x in lanes] == [("hook-2", "lifecycle", 1)]
    code, out, _ = cli("ledger", "requeue", "--all")
    assert code == 0 and "hook-3 lifecycle: 1 event requeued" in out and "1 lane unblocked" in out
    assert as_json(cli, "ledger", "blocked") == []
    states = db.execute("SELECT DISTINCT state FROM runrelay.ledger").fetchall()
    assert states == [("pending",)]


def test_ledger_skip_gives_up_a_blocked_head_and_the_lane_goes_on(
    cli: Cli, client: Client, db: psycopg.Connection
) -> None:
    head = _blocked(client, "skip-1")
    client.append_events("skip-1", [{"type": "order.next"}])
    code, out, _ = cli("ledger", "skip", "skip-1", "lifecycle", "--reason", "consumer gone")
    assert code == 0 and f"event {head}" in out and "skipped" in out
    row = db.execute(
        "SELECT state, skip_reason FROM runrelay.ledger WHERE event_id = %s", (head,)
    ).fetchone()
    assert row == ("skipped", "consumer gone")
    # The lane delivers what came after the skipped head.
    (nxt,) = client.claim_ledger("relay-1", run_id="skip-1")
    assert (
        nxt.seq
        > db.execute("SELECT seq FROM runrelay.ledger WHERE event_id = %s", (head,)).fetchone()[0]
    )
    # Not blocked any more: exit 1, nothing changed.
    before = table_checksum(db)
    code, out, _ = cli("ledger", "skip", "skip-1", "lifecycle", "--reason", "again", "--json")
    assert code == 1 and json.loads(out)["outcome"] == "not_blocked"
    assert table_checksum(db) == before
    code, _, err = cli("ledger", "skip", "skip-1", "sideways", "--reason", "x")
    assert code == 2 and "sideways" in err


def test_ledger_show_lists_a_runs_events_by_lane(cli: Cli, client: Client) -> None:
    client.enqueue_run("r")
    client.append_events("r", [{"type": "log", "lane": "observability"}, {"type": "charge"}])
    every = as_json(cli, "ledger", "show", "r")
    assert [(e["seq"], e["type"], e["lane"]) for e in every] == [
        (1, "run.queued", "lifecycle"),
        (2, "log", "observability"),
        (3, "charge", "lifecycle"),
    ]
    observed = as_json(cli, "ledger", "show", "r", "--lane", "observability")
    assert [e["type"] for e in observed] == ["log"]
    assert [e["seq"] for e in as_json(cli, "ledger", "show", "r", "--after-seq", "1")] == [2, 3]
    assert cli("ledger", "show", "nope")[0] == 4


# -- queues -----------------------------------------------------------------------------
def test_queues_pause_stops_claims_and_resume_restores_them(cli: Cli, client: Client) -> None:
    client.enqueue_run("m1", queue="email")
    client.enqueue_run("b1", queue="billing")
    assert cli("queues", "pause", "email", "--reason", "smtp outage")[:2] == (0, "email: paused\n")
    assert cli("queues", "pause", "email")[:2] == (0, "email: already_paused\n")

    rows = {q["queue"]: q for q in as_json(cli, "queues", "list")}
    assert rows["email"]["paused"] and rows["email"]["paused_reason"] == "smtp outage"
    assert (rows["email"]["queued"], rows["billing"]["queued"]) == (1, 1)
    assert not rows["billing"]["paused"]
    assert "paused: smtp outage" in cli("queues", "list")[1]
    # Claims of every queue skip the paused one.
    assert [a.run_id for a in client.claim_attempts("w", max_runs=5)] == ["b1"]

    assert as_json(cli, "queues", "resume", "email") == {"queue": "email", "outcome": "resumed"}
    assert cli("queues", "resume", "email")[:2] == (0, "email: not_paused\n")
    assert [a.run_id for a in client.claim_attempts("w", max_runs=5)] == ["m1"]


# -- status ---------------------------------------------------------------------------
def test_status_shows_runs_ledger_waits_and_paused_queues(cli: Cli, client: Client) -> None:
    client.enqueue_run("s")
    (attempt,) = client.claim_attempts("w")
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    client.suspend_attempt(**attempt.fence, wait={"kind": "sleep", "until": until})
    client.pause_queue("email")
    data = as_json(cli, "status")
    assert data["wait_stats"][0]["kind"] == "sleep" and data["wait_stats"][0]["runs"] == 1
    assert [q["queue"] for q in data["paused_queues"]] == ["email"]
    _, out, _ = cli("status")
    for title in ("runs", "ledger", "waits", "paused queues"):
        assert f"\n{title}" in f"\n{out}"


def test_status_watch_json_prints_a_line_a_refresh_that_follows_the_database(
    cli: Cli, client: Client
) -> None:
    client.enqueue_run("a")
    code, out, _ = cli("status", "--watch", "--json", "--count", "3", "--interval", "0.1")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3
    assert all(line["run_stats"][0]["runs"] == 1 for line in lines)
    assert lines[0]["at"] < lines[1]["at"] < lines[2]["at"]


def _cli_process(db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runrelay.cli", "--database-url", db_url, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_status_watch_ends_on_ctrl_c_with_exit_0(db: psycopg.Connection, db_url: str) -> None:
    Client(db).enqueue_run("a")
    watch = _cli_process(db_url, "status", "--watch", "--json", "--interval", "0.2")
    assert watch.stdout is not None
    first = json.loads(watch.stdout.readline())  # it is running: one refresh is out
    assert first["run_stats"][0]["runs"] == 1
    watch.send_signal(signal.SIGINT)
    _, err = watch.communicate(timeout=30)
    assert (watch.returncode, err) == (0, "")


def test_a_closed_pipe_ends_the_command_quietly(db: psycopg.Connection, db_url: str) -> None:
    client = Client(db)
    client.enqueue_runs([{"run_id": f"r{i}"} for i in range(200)])
    listing = _cli_process(db_url, "runs", "list", "--limit", "200", "--json")
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.read(10)
    listing.stdout.close()  # `| head -c 10`
    err = listing.stderr.read()
    assert listing.wait(timeout=30) == 128 + signal.SIGPIPE
    assert "Traceback" not in err


# -- who may run them ---------------------------------------------------------------------
@pytest.fixture
def producer_only(db: psycopg.Connection, db_url: str) -> Any:
    """A login granted only runrelay_producer (not the admin role)."""
    role = f"rr_producer_{os.getpid()}"
    ident = sql.Identifier(role)
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    db.execute(sql.SQL("GRANT runrelay_producer TO {}").format(ident))
    conninfo = psycopg.conninfo.conninfo_to_dict(db_url)
    conninfo["user"] = role
    conninfo.pop("password", None)
    yield psycopg.conninfo.make_conninfo(**conninfo)
    db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
    db.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_a_login_without_the_admin_role_is_refused_in_one_line(
    cli: Cli, db: psycopg.Connection, producer_only: str
) -> None:
    _fail_for_good(Client(db), "inv-1")
    before = table_checksum(db)
    for args in (("runs", "list"), ("runs", "retry", "inv-1"), ("queues", "pause", "email")):
        code, out, err = cli(*args, url=producer_only)
        assert (code, out) == (1, ""), args
        assert "the login needs runrelay_admin" in err and len(err.strip().splitlines()) == 1
    assert table_checksum(db) == before
    # The producer functions work with the producer role alone.
    assert cli("runs", "enqueue", "new", url=producer_only)[0] == 0


def test_the_dashboard_refuses_to_start_wrongly_in_one_line(
    cli: Cli, producer_only: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-write with no password, a login without the admin role, a
    password file that is missing or empty: each ends at once with one line,
    before anything listens."""
    monkeypatch.delenv("RUNRELAY_DASHBOARD_PASSWORD", raising=False)
    empty = tmp_path / "password"
    empty.write_text("\n")
    cases = [
        (("--read-write",), None, 2, "--read-write needs a password"),
        ((), producer_only, 1, "the login needs runrelay_admin"),
        (("--password-file", str(empty)), None, 2, "holds no password"),
        (("--password-file", str(tmp_path / "absent")), None, 2, "cannot read"),
    ]
    for args, url, expected, words in cases:
        code, out, err = cli("dashboard", *args, "--port", "0", **({"url": url} if url else {}))
        assert (code, out) == (expected, ""), (args, err)
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_an_unreachable_database_is_exit_3(cli: Cli) -> None:
    nowhere = "postgresql://runrelay@127.0.0.1:1/nothing?connect_timeout=2"
    for args in (("runs", "list"), ("queues", "list"), ("ledger", "blocked"), ("status",)):
        code, out, err = cli(*args, url=nowhere)
        assert (code, out) == (3, "")
        assert "cannot connect to the database" in err


# -- what data may do to a terminal -------------------------------------------
# Run ids, payloads and errors are data: printed, they must show as they are
# (rich markup not interpreted) and must not drive the terminal (control
# characters escaped). JSON output stays exact JSON. A run id may no longer
# hold a C0/C1 control character (the database refuses one), but it may hold
# markup and a bidirectional override; errors and payloads may hold anything.
HOSTILE_ID = "[bold]pay[/bold]\u202eevil"
HOSTILE_ID_SHOWN = b"[bold]pay[/bold]\\u202eevil"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app.py", line 3, in run\n'
    "    HANDLERS[job.queue](job)\n"
    "KeyError: '[red]mail'"
)
HOSTILE_ERROR = {"message": "boom [bold]x[/bold]\x1b[31m\nsecond line", "traceback": TRACEBACK}
HOSTILE_PAYLOAD = {"note": "[link=https://evil.example]click[/link]"}


def _cli_bytes(db_url: str, *args: str) -> tuple[int, bytes, bytes]:
    """`runrelay ARGS` as a user runs it, in its own process: (exit code,
    stdout bytes, stderr bytes)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "runrelay.cli", "--database-url", db_url, *args],
        cwd=REPO,
        capture_output=True,
        env=env,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def _hostile_run(client: Client) -> None:
    client.enqueue_run(HOSTILE_ID, payload=HOSTILE_PAYLOAD, max_attempts=1)
    (attempt,) = client.claim_attempts("w")
    assert client.fail_attempt(**attempt.fence, error=HOSTILE_ERROR) == "failed"


def _no_terminal_controls(out: bytes) -> None:
    assert b"\x1b" not in out and b"\x07" not in out, out
    assert "\u202e".encode() not in out, out


def test_runs_list_prints_markup_in_data_literally_and_escapes_control_characters(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    _hostile_run(client)
    code, out, err = _cli_bytes(db_url, "runs", "list")
    assert code == 0, err
    _no_terminal_controls(out)
    (row,) = [r for r in out.splitlines() if b"pay" in r]
    assert HOSTILE_ID_SHOWN in row, row
    # The error column: its message on the row's one line, markup as typed.
    assert b"boom [bold]x[/bold]\\x1b[31m\\nsecond line" in row, row


def test_runs_show_prints_tracebacks_and_payloads_as_they_are(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    _hostile_run(client)
    code, out, err = _cli_bytes(db_url, "runs", "show", HOSTILE_ID)
    assert code == 0, err
    _no_terminal_controls(out)
    assert b"run " + HOSTILE_ID_SHOWN in out, out
    assert b"HANDLERS[job.queue](job)" in out, out
    assert b"KeyError: '[red]mail'" in out, out
    assert b"[link=https://evil.example]click[/link]" in out, out


def test_json_output_stays_exact_json_whatever_the_data(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    _hostile_run(client)
    code, out, err = _cli_bytes(db_url, "runs", "list", "--json")
    assert code == 0, err
    _no_terminal_controls(out)  # the JSON encoder escapes them: \u001b
    (run,) = json.loads(out)
    assert (run["run_id"], run["error"]) == (HOSTILE_ID, HOSTILE_ERROR)
    code, out, err = _cli_bytes(db_url, "runs", "show", HOSTILE_ID, "--json")
    assert code == 0, err
    _no_terminal_controls(out)
    shown = json.loads(out)["run"]
    assert (shown["run_id"], shown["error"], shown["payload"]) == (
        HOSTILE_ID,
        HOSTILE_ERROR,
        HOSTILE_PAYLOAD,
    )


def test_one_line_answers_and_errors_escape_the_data_they_quote(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    _hostile_run(client)
    code, out, err = _cli_bytes(db_url, "runs", "cancel", HOSTILE_ID)
    assert (code, out, err) == (1, HOSTILE_ID_SHOWN + b": already_terminal\n", b"")
    before = table_checksum(db)
    code, out, err = _cli_bytes(db_url, "schedules", "set", "nightly", "\x1b[2J[bold]x * * * *")
    assert code == 2, (out, err)
    assert err.startswith(b"runrelay schedules set: rejected: "), err
    _no_terminal_controls(err)
    assert b'minute field "\\x1b[2j[bold]x"' in err, err  # the database's message quotes it
    assert table_checksum(db) == before


def test_runs_show_labels_an_earlier_attempts_error_as_history(
    cli: Cli, client: Client, db: psycopg.Connection
) -> None:
    """A run that failed once and then completed keeps the first attempt's
    error; runs show says it is an earlier attempt's, not the run's."""
    client.enqueue_run("flaky", max_attempts=3)
    (first,) = client.claim_attempts("w", ["default"])
    now = db.execute("SELECT now()").fetchone()[0]
    outcome = client.fail_attempt(**first.fence, error={"message": "timeout"}, retry_at=now)
    assert outcome == "retry_scheduled"
    (second,) = client.claim_attempts("w", ["default"])
    assert client.complete_attempt(**second.fence) == "completed"
    out = cli("runs", "show", "flaky")[1]
    assert "error (an earlier attempt's; the run went on)" in out
    # A run that failed for good shows its error as the run's.
    _fail_for_good(client, "dead")
    shown = cli("runs", "show", "dead")[1]
    assert "earlier attempt" not in shown and "card declined" in shown
