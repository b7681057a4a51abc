"""Live processes (docs/admin.md#live-processes): list_processes derives the
workers and relays from what their own calls write, and reads only what is
held now and the last hour, never the history of ended attempts and
delivered events."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import capture_plans
from runrelay import Client
from runrelay.cli import main
from runrelay.dashboard import DashboardSettings
from runrelay.dashboard import start as start_dashboard
from runrelay.errors import PermissionDenied
from sqlapi import call, enqueue

OLD = 200_000


def _buffers(plan: str) -> int:
    return max((int(x) for x in re.findall(r"(?:hit|read)=(\d+)", plan)), default=0)


def _load_history(db: psycopg.Connection) -> None:
    """200 000 runs ended two days ago, each with a completed attempt by one
    of fifty workers and an event acknowledged by one of five relays (its
    delivery record), and its lane: the history list_processes must not
    read."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, result, created_at, updated_at, finished_at)
        SELECT 'old-' || i, 'old', 'completed', '{}', now() - interval '2 days', 3, 1, '{}',
               now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": OLD},
    )
    db.execute(
        """
        INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at,
                                       finished_at, outcome, outcome_op)
        SELECT 'old-' || i, 1, 'old-worker-' || (i %% 50), gen_random_uuid(), 'completed',
               now() - interval '2 days', now() - interval '2 days', 'completed', 'complete'
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": OLD},
    )
    db.execute(
        """
        INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                            created_at, next_attempt_at)
        SELECT 'old-' || i, 'lifecycle', 1, 'run.completed', '{}', 'old-' || i || ':1',
               now() - interval '2 days', now() - interval '2 days'
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": OLD},
    )
    db.execute(
        """
        INSERT INTO runrelay.ledger_deliveries (run_id, lane, first_seq, last_seq, delivered_at,
                                                delivered_by, call_id)
        SELECT 'old-' || i, 'lifecycle', 1, 1, now() - interval '2 days',
               'old-relay-' || (i %% 5), gen_random_uuid()
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": OLD},
    )
    db.execute(
        """
        INSERT INTO runrelay.ledger_lanes (run_id, lane, delivered_below)
        SELECT 'old-' || i, 'lifecycle', 2 FROM generate_series(1, %(n)s) AS i
        """,
        {"n": OLD},
    )


def test_list_processes_reads_the_hour_never_the_history(db: psycopg.Connection) -> None:
    """Fifty workers and five relays that ended 200 000 attempts and
    acknowledged 200 000 events two days ago are not listed, and nothing of
    theirs is read: the plans have no sequential scan and touch a few
    buffers, before and after the tables are analysed."""
    _load_history(db)
    enqueue(db, "live-1", queue="live")
    claimed = call(db, "claim_attempts", worker="w-live", queues=["live"])
    assert [c["run_id"] for c in claimed] == ["live-1"]
    leased = call(db, "claim_ledger", relay="r-live", run_id="live-1")
    assert [e["kind"] for e in leased] == ["claimed"]

    take = capture_plans(db, analyze=True)
    for analysed in (False, True):
        if analysed:
            db.execute(
                "ANALYZE runrelay.attempts, runrelay.ledger_events, runrelay.ledger_deliveries,"
                " runrelay.ledger_lanes"
            )
        for _ in range(7):  # past PL/pgSQL's switch to a generic plan
            take()
            rows = call(db, "list_processes")
            assert [(r["name"], r["kind"], r["held"], r["presumed_dead"]) for r in rows] == [
                ("w-live", "worker", 1, False),
                ("r-live", "relay", 1, False),
            ]
            captured = take()
            inner = [p for p in captured if "WITH seen AS" in p]
            assert inner, captured
            text = "\n".join(inner)
            for table in ("attempts", "ledger_events", "ledger_deliveries", "ledger_lanes", "runs"):
                assert f"Seq Scan on {table}" not in text, text
            assert max(_buffers(p) for p in inner) < 100, text


# -- the command line ----------------------------------------------------------
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db: psycopg.Connection, db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`runrelay ARGS` in this process: (exit code, stdout, stderr). ``later``
    runs it with the database clock that far ahead (runrelay.clock_offset)."""

    def run(*args: str, later: str | None = None) -> tuple[int, str, str]:
        url = db_url
        if later is not None:
            url += "?" + urlencode(
                {"options": f"-c runrelay.clock_offset={later}"}, quote_via=quote
            )
        capsys.readouterr()
        try:
            code = main(["--database-url", url, *args])
        except SystemExit as exited:
            code = int(exited.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _two_workers_and_a_relay(client: Client) -> None:
    """w-1 holds run held-1 (a 30 s lease), w-2 completed done-1, relay r-1
    holds held-1's lifecycle lane (a 30 s lease)."""
    client.enqueue_run("held-1", queue="q1")
    client.enqueue_run("done-1", queue="q2")
    (held,) = client.claim_attempts("w-1", ["q1"], lease_seconds=30)
    (done,) = client.claim_attempts("w-2", ["q2"])
    assert client.complete_attempt(**done.fence, result={}) == "completed"
    (event,) = client.claim_ledger("r-1", run_id="held-1", lease_seconds=30)
    assert held.run_id == "held-1" and event.kind == "claimed"


def test_processes_lists_workers_and_relays_and_flags_the_presumed_dead(
    cli: Cli, db: psycopg.Connection
) -> None:
    client = Client(db)
    _two_workers_and_a_relay(client)
    rows = [
        (p["name"], p["kind"], p["held"], p["presumed_dead"])
        for p in json.loads(cli("processes", "--json")[1])
    ]
    assert rows == [
        ("w-1", "worker", 1, False),
        ("w-2", "worker", 0, False),
        ("r-1", "relay", 1, False),
    ]
    code, out, err = cli("processes", later="10min")
    assert code == 0, err
    lines = {
        name: next(line for line in out.splitlines() if f" {name} " in line)
        for name in ("w-1", "w-2", "r-1")
    }
    assert "presumed dead" in lines["w-1"] and "presumed dead" in lines["r-1"], out
    assert "presumed dead" not in lines["w-2"] and "alive" in lines["w-2"], out
    (dead,) = [
        p for p in json.loads(cli("processes", "--json", later="10min")[1]) if p["name"] == "w-1"
    ]
    assert dead["presumed_dead"] is True and dead["held"] == 1


def test_runs_show_says_when_a_presumed_dead_worker_holds_the_run(
    cli: Cli, db: psycopg.Connection
) -> None:
    client = Client(db)
    _two_workers_and_a_relay(client)
    code, out, err = cli("runs", "show", "held-1")
    assert code == 0, err
    assert "presumed dead" not in out
    code, out, err = cli("runs", "show", "held-1", later="10min")
    assert code == 0, err
    assert "held by worker w-1, presumed dead" in out
    shown = json.loads(cli("runs", "show", "held-1", "--json", later="10min")[1])
    assert shown["held_by_dead_worker"] == "w-1"
    assert (
        json.loads(cli("runs", "show", "done-1", "--json", later="10min")[1])["held_by_dead_worker"]
        is None
    )


def test_a_login_without_the_admin_role_may_not_list_processes(
    db: psycopg.Connection, db_url: str
) -> None:
    """A worker's login: list_processes is refused (42501), a typed error."""
    role = "processes_worker_login"
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' IN ROLE runrelay_worker").format(
            sql.Identifier(role)
        )
    )
    try:
        parts = conninfo_to_dict(db_url)
        parts.update(user=role, password="pw")
        with Client(make_conninfo(**parts)) as worker, pytest.raises(PermissionDenied):
            worker.list_processes()
    finally:
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- the dashboard -------------------------------------------------------------
PASSWORD = "the right password"


@pytest.fixture
def dashboard(db: psycopg.Connection, db_url: str) -> Iterator[tuple[httpx.Client, str]]:
    """A real read-write dashboard (uvicorn on 127.0.0.1) and an httpx
    client logged in to it: (client, base URL)."""
    server = start_dashboard(
        DashboardSettings(db_url, password=PASSWORD, secret=b"s" * 32, read_write=True)
    )
    base = server.url.rstrip("/")
    try:
        with httpx.Client(headers={"origin": base}) as web:
            token = _csrf(web.get(f"{base}/login").text)
            answer = web.post(
                f"{base}/login",
                data={"csrf": token, "next": "/", "name": "ana", "password": PASSWORD},
            )
            assert answer.status_code in (200, 303), answer.text
            yield web, base
    finally:
        server.stop()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


def _row(page: str, name: str) -> str:
    found = re.search(rf'<tr data-name="{re.escape(name)}"[^>]*>', page)
    assert found is not None, page
    return found.group(0)


def test_the_processes_page_lists_them_and_highlights_the_presumed_dead(
    dashboard: tuple[httpx.Client, str], db: psycopg.Connection
) -> None:
    web, base = dashboard
    _two_workers_and_a_relay(Client(db))
    page = web.get(f"{base}/processes")
    assert page.status_code == 200, page.text
    assert 'href="/processes"' in page.text
    for name in ("w-1", "w-2", "r-1"):
        assert "data-presumed-dead" not in _row(page.text, name)
    # Every lease lapses: the holders are highlighted, the idle worker is not.
    db.execute("UPDATE runrelay.attempts SET lease_expires_at = now() - interval '1 minute'")
    db.execute(
        "UPDATE runrelay.ledger_lanes SET lease_expires_at = now() - interval '1 minute'"
        " WHERE lease_owner IS NOT NULL"
    )
    page = web.get(f"{base}/processes")
    assert 'class="row-bad" data-presumed-dead' in _row(page.text, "w-1")
    assert 'class="row-bad" data-presumed-dead' in _row(page.text, "r-1")
    assert "data-presumed-dead" not in _row(page.text, "w-2")
    run = web.get(f"{base}/run", params={"id": "held-1"})
    assert 'data-testid="dead-holder"' in run.text and "held by worker w-1" in run.text
    done = web.get(f"{base}/run", params={"id": "done-1"})
    assert 'data-testid="dead-holder"' not in done.text


def _blocked(client: Client, run_id: str) -> int:
    """run_id's lifecycle lane blocked behind its failed head (run.queued),
    with one more event behind it; returns the head's event id."""
    client.enqueue_run(run_id)
    client.append_events(run_id, [{"type": "after", "payload": {}}])
    (head,) = client.claim_ledger("relay-1", run_id=run_id)
    (failure,) = client.fail_ledger("relay-1", [head.event_id], {"http": 410}, permanent=True)
    assert failure.outcome == "blocked"
    return head.event_id


def _states(db: psycopg.Connection, run_id: str) -> list[tuple[str, str]]:
    rows = db.execute(
        "SELECT type, state FROM runrelay.ledger WHERE run_id = %s ORDER BY seq", [run_id]
    ).fetchall()
    return [(t, s) for t, s in rows]


def test_skip_from_the_dashboard_needs_its_confirmation_page_and_applies_once(
    dashboard: tuple[httpx.Client, str], db: psycopg.Connection
) -> None:
    web, base = dashboard
    head = _blocked(Client(db), "blk-1")
    listing = web.get(f"{base}/deliveries")
    assert 'href="/skip?run_id=blk-1&amp;lane=lifecycle"' in listing.text, listing.text
    csrf = _csrf(listing.text)
    # A skip posted without the confirmation page's form: refused, nothing changed.
    direct = {"csrf": csrf, "next": "/deliveries", "run_id": "blk-1", "lane": "lifecycle",
              "reason": "gone", "call_id": str(uuid.uuid4())}  # fmt: skip
    answer = web.post(f"{base}/actions/skip", data=direct)
    assert answer.status_code == 303
    assert "confirmed on its own page" in web.get(f"{base}/deliveries").text
    assert _states(db, "blk-1") == [("run.queued", "failed"), ("after", "pending")]
    # A post without the CSRF token: refused.
    forged = {**direct, "confirmed": "yes", "csrf": "nope"}
    assert web.post(f"{base}/actions/skip", data=forged).status_code == 403
    assert _states(db, "blk-1") == [("run.queued", "failed"), ("after", "pending")]
    # The confirmation page shows the head and posts the confirmed form.
    confirm = web.get(f"{base}/skip", params={"run_id": "blk-1", "lane": "lifecycle"})
    assert confirm.status_code == 200, confirm.text
    assert f"{head} (seq 1)" in confirm.text and "410" in confirm.text
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    assert form["confirmed"] == "yes" and form["call_id"]
    for _ in range(2):  # sent twice (a double click, a retried request): applied once
        answer = web.post(f"{base}/actions/skip", data={**form, "reason": "endpoint gone"})
        assert answer.status_code == 303
    assert "the failed head skipped" in web.get(f"{base}/deliveries").text
    assert _states(db, "blk-1") == [("run.queued", "skipped"), ("after", "pending")]
    (reason,) = db.execute(
        "SELECT skip_reason FROM runrelay.ledger WHERE event_id = %s", [head]
    ).fetchone() or (None,)
    assert reason == "endpoint gone (dashboard:ana)"
    assert db.execute("SELECT count(*) FROM runrelay.calls").fetchone() == (1,)
    gone = web.get(f"{base}/skip", params={"run_id": "blk-1", "lane": "lifecycle"})
    assert 'data-testid="not-blocked"' in gone.text


def test_ledger_skip_ends_a_blocked_head_and_answers_a_repeat_the_same(
    cli: Cli, db: psycopg.Connection
) -> None:
    head = _blocked(Client(db), "cli-1")
    # Bad usage and bad input: exit 2, nothing changed.
    assert cli("ledger", "skip", "cli-1", "lifecycle")[0] == 2  # --reason is required
    assert cli("ledger", "skip", "cli-1", "audit", "--reason", "x")[0] == 2
    assert cli("ledger", "skip", "cli-1", "lifecycle", "--reason", "  ")[0] == 2
    assert _states(db, "cli-1") == [("run.queued", "failed"), ("after", "pending")]

    call_id = str(uuid.uuid4())
    code, out, err = cli(
        "ledger", "skip", "cli-1", "lifecycle", "--reason", "gone", "--call-id", call_id
    )
    assert code == 0, err
    assert f"event {head} (seq 1) skipped" in out
    assert _states(db, "cli-1") == [("run.queued", "skipped"), ("after", "pending")]
    # The same call again (a lost answer): the first answer, nothing written.
    code, out, err = cli(
        "ledger", "skip", "cli-1", "lifecycle", "--reason", "gone", "--call-id", call_id, "--json"
    )
    assert code == 0, err
    assert json.loads(out) == {"event_id": head, "seq": 1, "outcome": "skipped"}
    # A new call: the lane is not blocked any more, exit 1.
    code, out, err = cli("ledger", "skip", "cli-1", "lifecycle", "--reason", "gone", "--json")
    assert code == 1
    row = json.loads(out)
    assert row["outcome"] == "not_blocked" and row["seq"] == 2
