"""Prometheus metrics against a real server: the exporter scraped over real
HTTP while runs and ledger events flow, a database that goes away, the
`runrelay exporter` command, and the counters real Worker, AsyncWorker and
Relay loops record into a registry."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from psycopg_pool import ConnectionPool

from conftest import REPO, run_in_thread
from runrelay import AsyncClient, Client, LedgerEvent
from runrelay.metrics import Exporter, RelayMetrics, WorkerMetrics, serve
from runrelay.relay import Relay
from runrelay.sinks import DeliveryError
from runrelay.worker import AsyncWorker, Job, Retry, Worker

NOWHERE = "postgresql://runrelay@127.0.0.1:1/nothing?connect_timeout=2"
HOUR = 3600.0


class Scrape:
    """One scrape's samples, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.help: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.help[family.name] = family.documentation
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                self.samples[key] = sample.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


def scrape(port: int) -> Scrape:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


def registry_value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll until `predicate` holds; a bound so that a broken build fails
    instead of hanging (nothing here asserts how long anything took)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


@pytest.fixture
def exporter(db: psycopg.Connection, db_url: str) -> Iterator[Exporter]:
    """The exporter's HTTP server in this process on a free port, reading
    the test database."""
    running = serve(db_url, host="127.0.0.1", port=0)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def client(db: psycopg.Connection, db_url: str) -> Iterator[Client]:
    pool = ConnectionPool(db_url, min_size=1, max_size=8, kwargs={"autocommit": True})
    with pool:
        yield Client(pool)


def _an_hour_ago(db: psycopg.Connection) -> Client:
    """A client on `db` whose database clock reads an hour ago (the test
    clock): the events it appends look an hour old to the exporter."""
    db.execute("SET runrelay.clock_offset = '-1 hour'")
    return Client(db)


def _hour_ago() -> datetime:
    return datetime.now(UTC) - timedelta(hours=1)


# -- the exporter ---------------------------------------------------------------
def test_every_exported_metric_has_help_and_the_runrelay_prefix(exporter: Exporter) -> None:
    first = scrape(exporter.port)
    assert first.get("runrelay_up") == 1
    assert first.get("runrelay_scrape_duration_seconds") is not None
    for name, text in first.help.items():
        assert name.startswith("runrelay_"), name
        assert len(text) > 20, f"{name} has no real HELP text"
    # Both lanes and every event state are there from the start, at zero.
    for lane in ("lifecycle", "observability"):
        for state in ("pending", "leased", "delivered", "failed"):
            assert first.get("runrelay_ledger_events", lane=lane, state=state) == 0
        assert first.get("runrelay_ledger_blocked_heads", lane=lane) == 0
        assert first.get("runrelay_ledger_oldest_pending_age_seconds", lane=lane) == 0


def test_run_gauges_follow_runs_as_they_are_claimed_and_completed(
    db: psycopg.Connection, client: Client, exporter: Exporter
) -> None:
    for i in range(3):
        client.enqueue_run(f"e{i}", queue="email", run_at=_hour_ago())
    client.enqueue_run("b0", queue="billing", concurrency_key="acct-1")
    client.enqueue_run("b1", queue="billing", concurrency_key="acct-1")

    queued = scrape(exporter.port)
    assert queued.get("runrelay_runs", queue="email", status="queued") == 3
    assert queued.get("runrelay_runs", queue="email", status="completed") == 0
    assert queued.get("runrelay_runs", queue="billing", status="queued") == 2
    assert queued.get("runrelay_runs_held_by_key", queue="billing") == 1
    assert queued.get("runrelay_runs_held_by_key", queue="email") == 0
    email_age = queued.get("runrelay_runs_oldest_runnable_age_seconds", queue="email")
    assert email_age is not None and HOUR - 60 <= email_age <= HOUR + 600

    (first,) = client.claim_attempts("w1", ["email"], max_runs=1)
    assert client.complete_attempt(**first.fence, result={"ok": True}) == "completed"
    claimed = client.claim_attempts("w1", ["email"], max_runs=2)
    assert len(claimed) == 2

    moved = scrape(exporter.port)
    assert moved.get("runrelay_runs", queue="email", status="queued") == 0
    assert moved.get("runrelay_runs", queue="email", status="running") == 2
    assert moved.get("runrelay_runs", queue="email", status="completed") == 1
    # Nothing of the queue is runnable any more: the age drops to zero.
    assert moved.get("runrelay_runs_oldest_runnable_age_seconds", queue="email") == 0

    for attempt in claimed:
        client.fail_attempt(**attempt.fence, error={"message": "no"}, retry_at=None)
    client.cancel_run("b1")
    ended = scrape(exporter.port)
    assert ended.get("runrelay_runs", queue="email", status="running") == 0
    assert ended.get("runrelay_runs", queue="email", status="queued") == 2  # retries
    assert ended.get("runrelay_runs", queue="billing", status="cancelled") == 1
    assert ended.get("runrelay_runs_held_by_key", queue="billing") == 0


def test_waiting_runs_are_counted_by_queue_and_wait_kind(
    client: Client, exporter: Exporter
) -> None:
    waits = {
        "s": {"kind": "sleep", "until": (datetime.now(UTC) + timedelta(hours=1)).isoformat()},
        "e1": {"kind": "event", "name": "approved"},
        "e2": {"kind": "event", "name": "approved"},
        "d": {"kind": "detached_runner", "runner": "gpu-7"},
    }
    for run_id in waits:
        client.enqueue_run(run_id, queue="ops")
    for attempt in client.claim_attempts("w1", ["ops"], max_runs=len(waits)):
        outcome = client.suspend_attempt(**attempt.fence, wait=waits[attempt.run_id])
        assert outcome == "waiting", (attempt.run_id, outcome)

    waiting = scrape(exporter.port)
    assert waiting.get("runrelay_runs", queue="ops", status="waiting") == 4
    assert waiting.get("runrelay_runs_waiting", queue="ops", kind="sleep") == 1
    assert waiting.get("runrelay_runs_waiting", queue="ops", kind="event") == 2
    assert waiting.get("runrelay_runs_waiting", queue="ops", kind="detached_runner") == 1

    # A signal wakes one event wait: it is queued again, no longer waiting.
    assert client.signal_run("e1", "approved") == "resumed"
    client.cancel_run("d")
    woken = scrape(exporter.port)
    assert woken.get("runrelay_runs_waiting", queue="ops", kind="event") == 1
    assert woken.get("runrelay_runs_waiting", queue="ops", kind="detached_runner") == 0
    assert woken.get("runrelay_runs_waiting", queue="ops", kind="sleep") == 1


def test_ledger_gauges_follow_appends_claims_and_acks(
    db: psycopg.Connection, client: Client, exporter: Exporter
) -> None:
    old = _an_hour_ago(db)
    old.enqueue_run("r1")
    old.append_events("r1", [{"type": "log", "lane": "observability"} for _ in range(3)])

    appended = scrape(exporter.port)
    assert appended.get("runrelay_ledger_events", lane="lifecycle", state="pending") == 1
    assert appended.get("runrelay_ledger_events", lane="observability", state="pending") == 3
    lag = appended.get("runrelay_ledger_oldest_pending_age_seconds", lane="observability")
    assert lag is not None and HOUR - 60 <= lag <= HOUR + 600

    leased = client.claim_ledger("relay-1", "observability", max_events=10, batch=True)
    assert len(leased) == 3
    during = scrape(exporter.port)
    assert during.get("runrelay_ledger_events", lane="observability", state="leased") == 3
    assert during.get("runrelay_ledger_events", lane="observability", state="pending") == 0

    client.ack_ledger("relay-1", "r1", [e.event_id for e in leased], batch=True)
    delivered = scrape(exporter.port)
    assert delivered.get("runrelay_ledger_events", lane="observability", state="delivered") == 3
    assert delivered.get("runrelay_ledger_events", lane="observability", state="leased") == 0
    assert delivered.get("runrelay_ledger_oldest_pending_age_seconds", lane="observability") == 0
    # The lifecycle lane was not touched: its event still waits.
    assert delivered.get("runrelay_ledger_events", lane="lifecycle", state="pending") == 1


def test_a_blocked_head_shows_up_until_it_is_requeued(
    db: psycopg.Connection, client: Client, exporter: Exporter
) -> None:
    client.enqueue_run("poison")
    client.enqueue_run("fine")
    (head,) = client.claim_ledger("relay-1", "lifecycle", run_id="poison")
    client.fail_ledger("relay-1", [head.event_id], {"message": "rejected"}, permanent=True)

    blocked = scrape(exporter.port)
    assert blocked.get("runrelay_ledger_blocked_heads", lane="lifecycle") == 1
    assert blocked.get("runrelay_ledger_events", lane="lifecycle", state="failed") == 1
    assert blocked.get("runrelay_ledger_events", lane="lifecycle", state="pending") == 1
    assert blocked.get("runrelay_ledger_blocked_heads", lane="observability") == 0

    assert client.requeue_ledger_event(head.event_id) is True
    requeued = scrape(exporter.port)
    assert requeued.get("runrelay_ledger_blocked_heads", lane="lifecycle") == 0
    assert requeued.get("runrelay_ledger_events", lane="lifecycle", state="failed") == 0
    assert requeued.get("runrelay_ledger_events", lane="lifecycle", state="pending") == 2


def test_the_lag_of_a_blocked_head_is_told_apart_from_relays_falling_behind(
    db: psycopg.Connection, client: Client, exporter: Exporter
) -> None:
    """An hour-old head blocks its lane (the events behind it wait for an
    operator, not for a relay); a fresh run's event waits for a relay. The
    blocked age is the hour, the deliverable lag the fresh event's; a skip
    ends the blocked age and turns the event behind it into relay lag."""
    old = _an_hour_ago(db)
    old.enqueue_run("poison")
    old.append_events("poison", [{"type": "behind", "payload": {}}])
    (head,) = old.claim_ledger("relay-1", "lifecycle", run_id="poison")
    old.fail_ledger("relay-1", [head.event_id], {"message": "rejected"}, permanent=True)
    db.execute("RESET runrelay.clock_offset")
    client.enqueue_run("fresh")

    blocked = scrape(exporter.port)
    blocked_age = blocked.get("runrelay_ledger_blocked_age_seconds", lane="lifecycle")
    lag = blocked.get("runrelay_ledger_deliverable_age_seconds", lane="lifecycle")
    assert blocked_age is not None and HOUR - 60 < blocked_age < HOUR + 600, blocked_age
    assert lag is not None and lag < 600, lag  # "behind", an hour old, is blocked: not relay lag
    assert (
        blocked.get("runrelay_ledger_oldest_pending_age_seconds", lane="lifecycle") or 0
    ) > HOUR - 60
    assert blocked.get("runrelay_ledger_blocked_age_seconds", lane="observability") == 0

    (row,) = client.skip_ledger_events("poison", "lifecycle", "rejected for good")
    assert row.outcome == "skipped"
    skipped = scrape(exporter.port)
    assert skipped.get("runrelay_ledger_blocked_age_seconds", lane="lifecycle") == 0
    assert skipped.get("runrelay_ledger_events", lane="lifecycle", state="skipped") == 1
    assert skipped.get("runrelay_ledger_events", lane="lifecycle", state="failed") == 0
    lag = skipped.get("runrelay_ledger_deliverable_age_seconds", lane="lifecycle")
    assert lag is not None and lag > HOUR - 60, lag  # "behind" now waits for a relay


def test_processes_are_counted_by_kind_alive_or_presumed_dead(
    db: psycopg.Connection, client: Client, exporter: Exporter
) -> None:
    client.enqueue_run("held", queue="q")
    client.enqueue_run("lapsed", queue="q2")
    client.claim_attempts("w-alive", ["q"], lease_seconds=300)
    client.claim_attempts("w-dead", ["q2"], lease_seconds=5)
    client.claim_ledger("r-alive", run_id="held", lease_seconds=300)
    db.execute(
        "UPDATE runrelay.attempts SET lease_expires_at = now() - interval '1 minute'"
        " WHERE worker = 'w-dead'"
    )
    result = scrape(exporter.port)
    assert result.get("runrelay_processes", kind="worker", state="alive") == 1
    assert result.get("runrelay_processes", kind="worker", state="presumed_dead") == 1
    assert result.get("runrelay_processes", kind="relay", state="alive") == 1
    assert result.get("runrelay_processes", kind="relay", state="presumed_dead") == 0


def _queue_series(result: Scrape, name: str) -> dict[str, float]:
    """Per queue, the sum of `name`'s samples of that queue."""
    sums: dict[str, float] = {}
    for (sample, labels), value in result.samples.items():
        if sample == name:
            queue = dict(labels)["queue"]
            sums[queue] = sums.get(queue, 0.0) + value
    return sums


def test_thousands_of_queues_give_a_bounded_number_of_series_with_the_totals_kept(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    # 3000 queues of one queued run, plus three busy queues of three runs.
    items: list[dict[str, Any]] = [{"run_id": f"q{i}", "queue": f"q{i:04d}"} for i in range(3000)]
    items += [{"run_id": f"busy-{q}-{n}", "queue": f"busy{q}"} for q in range(3) for n in range(3)]
    for start in range(0, len(items), 1000):
        client.enqueue_runs(items[start : start + 1000])
    total_runs = len(items)

    for bound in (2, 50):
        running = serve(db_url, host="127.0.0.1", port=0, max_queues=bound)
        try:
            result = scrape(running.port)
        finally:
            running.close()
        runs = _queue_series(result, "runrelay_runs")
        # The bound plus the one folded label, whatever the number of queues.
        assert len(runs) == bound + 1
        assert "_other" in runs
        assert sum(runs.values()) == total_runs
        # The most active queues keep their own series.
        for q in range(min(bound, 3)):
            assert result.get("runrelay_runs", queue=f"busy{q}", status="queued") == 3
        # _other sums exactly the queues that were folded.
        own = sum(v for queue, v in runs.items() if queue != "_other")
        assert runs["_other"] == total_runs - own
        waiting = _queue_series(result, "runrelay_runs_waiting")
        assert len(waiting) <= bound + 1
        assert len(result.samples) < 20 * (bound + 1) + 50


def test_a_scrape_reads_a_bounded_number_of_rows_however_many_queues(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    from runrelay.metrics import StatsCollector

    client.enqueue_runs([{"run_id": f"r{i}", "queue": f"q{i:04d}"} for i in range(2000)])
    collector = StatsCollector(db_url, max_queues=10)
    try:
        rows = collector._read()
    finally:
        collector.close()
    run_rows = [row for row in rows if row.source == "run"]
    assert len({row.name for row in run_rows}) == 11
    assert sum(row.count for row in run_rows) == 2000


def test_a_max_queues_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_queues"):
        serve(NOWHERE, host="127.0.0.1", port=0, max_queues=0)


def test_an_unreachable_database_is_runrelay_up_0_and_the_exporter_keeps_serving() -> None:
    exporter = serve(NOWHERE, host="127.0.0.1", port=0)
    try:
        for _ in range(2):
            down = scrape(exporter.port)
            assert down.get("runrelay_up") == 0
            assert down.get("runrelay_scrape_duration_seconds") is not None
            assert not any(n.startswith(("runrelay_runs", "runrelay_ledger")) for n in down.names())
    finally:
        exporter.close()


def test_a_connection_lost_between_scrapes_is_one_down_scrape_then_up_again(
    db: psycopg.Connection, exporter: Exporter
) -> None:
    """The exporter keeps one connection between scrapes; when the server
    drops it, that scrape says runrelay_up 0 and the next one reconnects."""
    assert scrape(exporter.port).get("runrelay_up") == 1
    others = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query LIKE '%run_stats%'"
    )
    (pid,) = db.execute(others).fetchall()
    assert db.execute("SELECT pg_terminate_backend(%s)", pid).fetchone() == (True,)
    _wait_for(lambda: db.execute(others).fetchall() == [], "the backend is gone")
    assert scrape(exporter.port).get("runrelay_up") == 0
    assert scrape(exporter.port).get("runrelay_up") == 1


def test_a_schema_that_is_not_installed_is_runrelay_up_0(db_url: str) -> None:
    exporter = serve(db_url, schema="not_installed", host="127.0.0.1", port=0)
    try:
        assert scrape(exporter.port).get("runrelay_up") == 0
    finally:
        exporter.close()


# -- the command ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runrelay.cli", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _serving(port: int, proc: subprocess.Popen[str]) -> Callable[[], bool]:
    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.communicate()[1][-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    return up


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM; the process must exit 0 without a traceback. Returns stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return err


def test_the_exporter_command_serves_until_sigterm(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    client.enqueue_run("cli-1", queue="cli")
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    proc = _cli("exporter", "--host", "127.0.0.1", "--port", str(port), env=env)
    try:
        _wait_for(_serving(port, proc), "the exporter listens")
        seen = scrape(port)
        assert seen.get("runrelay_up") == 1
        assert seen.get("runrelay_runs", queue="cli", status="queued") == 1
        client.enqueue_run("cli-2", queue="cli")
        assert scrape(port).get("runrelay_runs", queue="cli", status="queued") == 2
        err = _stop(proc)
        assert f"on http://127.0.0.1:{port}/metrics" in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_exporter_command_bounds_queues_with_max_queues_on_127_0_0_1(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    client.enqueue_runs([{"run_id": f"m{i}", "queue": f"mq{i}"} for i in range(5)])
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    proc = _cli("exporter", "--port", str(port), "--max-queues", "2", env=env)
    try:
        _wait_for(_serving(port, proc), "the exporter listens")
        runs = _queue_series(scrape(port), "runrelay_runs")
        assert len(runs) == 3 and runs["_other"] == 3
        err = _stop(proc)
        assert f"on http://127.0.0.1:{port}/metrics" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("bound", ["0", "-1", "many"])
def test_a_bad_max_queues_is_a_usage_error(bound: str) -> None:
    proc = _cli("exporter", "--max-queues", bound, env={**os.environ, "DATABASE_URL": NOWHERE})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "--max-queues" in err


def test_the_exporter_command_starts_while_the_database_is_away() -> None:
    port = _free_port()
    proc = _cli("exporter", "--host", "127.0.0.1", "--port", str(port), "--database-url",
                NOWHERE, env=dict(os.environ))  # fmt: skip
    try:
        _wait_for(_serving(port, proc), "the exporter listens")
        assert scrape(port).get("runrelay_up") == 0
        assert scrape(port).get("runrelay_up") == 0
        err = _stop(proc)
        # One warning when the database went away, not one per scrape.
        assert err.count("reporting runrelay_up 0") == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _cli("exporter", "--host", "127.0.0.1", "--port", str(port), "--database-url",
                    NOWHERE, env=dict(os.environ))  # fmt: skip
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runrelay exporter: cannot listen on"), err


@pytest.mark.parametrize(
    "args",
    [["exporter"], ["worker", "json:loads", "--metrics-port", "9"]],
    ids=lambda a: a[0],
)
def test_without_prometheus_client_metrics_are_one_line_and_exit_1(args: list[str]) -> None:
    """As if the `metrics` extra were not installed: an entry of None in
    sys.modules is how Python itself makes an import fail."""
    program = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from runrelay.cli import main\n"
        f"sys.exit(main({[*args, '--database-url', NOWHERE]!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"runrelay {args[0]}: needs prometheus_client: pip install 'runrelay[metrics]'"
    )


def test_loops_without_a_registry_never_import_prometheus_client(
    db: psycopg.Connection, db_url: str
) -> None:
    program = (
        "import sys\n"
        "from runrelay import Client\n"
        "from runrelay.relay import Relay\n"
        "from runrelay.worker import Worker\n"
        "import runrelay.cli\n"
        f"client = Client({db_url!r})\n"
        "Worker(client, lambda job: None).run(until_idle=0.1)\n"
        "Relay(client, lambda lane, events: None).run(until_idle=0.1)\n"
        "loaded = [m for m in sys.modules if m.startswith(('prometheus', 'runrelay.metrics'))]\n"
        "print(sorted(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


# -- the loops ------------------------------------------------------------------
def _statuses(db: psycopg.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())


def _outcome_totals(registry: CollectorRegistry) -> dict[str, float]:
    """runrelay_worker_outcomes_total summed over queues, keyed as stats are
    (write:outcome)."""
    totals: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "runrelay_worker_outcomes_total":
                key = f"{sample.labels['write']}:{sample.labels['outcome']}"
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def _stats_outcomes(stats: dict[str, int]) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items() if ":" in k and not k.startswith("heartbeat:")}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-calls"])
def test_worker_records_claims_outcomes_handler_time_and_heartbeats(
    db: psycopg.Connection, client: Client, fused: bool
) -> None:
    registry = CollectorRegistry()

    def heartbeats_ok() -> float:
        return registry_value(registry, "runrelay_worker_heartbeats_total", outcome="ok")

    def handler(job: Job) -> Any:
        kind = job.payload["kind"]
        if kind == "boom":
            raise ValueError("nope")
        if kind == "retry" and job.attempt.attempt == 1:
            raise Retry("later", after=0.05)
        if kind == "beat":  # stays in flight until a heartbeat renewed its lease
            _wait_for(lambda: heartbeats_ok() >= 1, "a heartbeat")
        return {"kind": kind}

    client.enqueue_run("ok", queue="email", payload={"kind": "ok"})
    client.enqueue_run("retry", queue="email", payload={"kind": "retry"})
    client.enqueue_run("beat", queue="email", payload={"kind": "beat"})
    client.enqueue_run("boom", queue="billing", payload={"kind": "boom"}, max_attempts=1)
    worker = Worker(
        client, handler, concurrency=3, poll_interval=0.05, heartbeat_every=0.2,
        fused=fused, metrics=registry,
    )  # fmt: skip
    thread, done = run_in_thread(worker)
    _wait_for(lambda: set(_statuses(db).values()) <= {"completed", "failed"}, "all runs end")
    worker.stop()
    thread.join(30)
    done.result(timeout=1)
    assert _statuses(db) == {
        "ok": "completed", "retry": "completed", "beat": "completed", "boom": "failed",
    }  # fmt: skip

    claimed = "runrelay_worker_runs_claimed_total"
    assert registry_value(registry, claimed, queue="email") == 4  # retry ran twice
    assert registry_value(registry, claimed, queue="billing") == 1
    assert worker.stats["claimed"] == 5

    outcomes = "runrelay_worker_outcomes_total"
    assert registry_value(
        registry, outcomes, queue="email", write="complete", outcome="completed"
    ) == 3  # fmt: skip
    assert registry_value(
        registry, outcomes, queue="email", write="fail", outcome="retry_scheduled"
    ) == 1  # fmt: skip
    assert registry_value(
        registry, outcomes, queue="billing", write="fail", outcome="failed"
    ) == 1  # fmt: skip
    # The metrics and `stats` count the same writes.
    assert _outcome_totals(registry) == _stats_outcomes(worker.stats)

    handler_time = "runrelay_worker_handler_duration_seconds"
    assert registry_value(registry, f"{handler_time}_count", queue="email") == 4
    assert registry_value(registry, f"{handler_time}_count", queue="billing") == 1
    assert registry_value(registry, f"{handler_time}_sum", queue="email") > 0
    assert heartbeats_ok() >= 1
    assert registry_value(registry, "runrelay_worker_write_errors_total") == 0


def test_a_cancelled_run_is_a_cancelled_heartbeat_and_outcome(
    db: psycopg.Connection, client: Client
) -> None:
    registry = CollectorRegistry()
    started = threading.Event()

    def handler(job: Job) -> Any:
        started.set()
        job.cancelled.wait(60)
        return {}

    client.enqueue_run("long")
    worker = Worker(client, handler, concurrency=1, poll_interval=0.05, heartbeat_every=0.1,
                    metrics=registry)  # fmt: skip
    thread, done = run_in_thread(worker)
    assert started.wait(60)
    client.cancel_run("long")
    _wait_for(lambda: _statuses(db) == {"long": "cancelled"}, "the run is cancelled")
    _wait_for(lambda: worker.stats.get("complete:cancelled") == 1, "the write answered")
    worker.stop()
    thread.join(30)
    done.result(timeout=1)
    assert registry_value(registry, "runrelay_worker_heartbeats_total", outcome="cancelled") == 1
    assert registry_value(
        registry, "runrelay_worker_outcomes_total",
        queue="default", write="complete", outcome="cancelled",
    ) == 1  # fmt: skip


def test_async_worker_records_into_the_registry(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    registry = CollectorRegistry()

    async def handler(job: Job) -> Any:
        await asyncio.sleep(0)
        if job.payload.get("boom"):
            raise ValueError("nope")
        return {"done": job.run_id}

    for i in range(4):
        client.enqueue_run(f"a{i}", payload={"boom": i == 3}, max_attempts=1)

    async def main() -> dict[str, int]:
        async with AsyncClient(db_url) as aclient:
            worker = AsyncWorker(aclient, handler, concurrency=2, poll_interval=0.05,
                                 metrics=registry)  # fmt: skip
            task = asyncio.create_task(worker.run())
            while set((await asyncio.to_thread(_statuses, db)).values()) - {"completed", "failed"}:
                await asyncio.sleep(0.05)
            worker.stop()
            await task
            return worker.stats

    stats = asyncio.run(main())
    assert _statuses(db) == {
        "a0": "completed",
        "a1": "completed",
        "a2": "completed",
        "a3": "failed",
    }
    assert registry_value(registry, "runrelay_worker_runs_claimed_total", queue="default") == 4
    assert _outcome_totals(registry) == _stats_outcomes(stats) == {
        "complete:completed": 3, "fail:failed": 1,
    }  # fmt: skip
    assert (
        registry_value(registry, "runrelay_worker_handler_duration_seconds_count", queue="default")
        == 4
    )


def test_workers_sharing_a_registry_add_up(db: psycopg.Connection, client: Client) -> None:
    registry = CollectorRegistry()
    for i in range(6):
        client.enqueue_run(f"s{i}")
    workers = [
        Worker(client, lambda job: {}, concurrency=1, poll_interval=0.05, metrics=registry)
        for _ in range(2)
    ]
    threads = [run_in_thread(w) for w in workers]
    _wait_for(lambda: set(_statuses(db).values()) == {"completed"}, "all runs complete")
    for worker in workers:
        worker.stop()
    for thread, done in threads:
        thread.join(30)
        done.result(timeout=1)
    assert sum(w.stats["claimed"] for w in workers) == 6
    assert registry_value(registry, "runrelay_worker_runs_claimed_total", queue="default") == 6
    assert WorkerMetrics.of(registry) is WorkerMetrics.of(registry)


def test_relay_records_deliveries_failures_renewals_and_delivery_time(
    db: psycopg.Connection, client: Client
) -> None:
    registry = CollectorRegistry()
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05, retry_max_seconds = 0.2")
    calls: dict[str, int] = {}

    def renewed() -> float:
        return registry_value(
            registry, "runrelay_relay_lease_renewals_total", lane="lifecycle", result="renewed"
        )

    def sink(lane: str, events: Sequence[LedgerEvent]) -> None:
        run_id = events[0].run_id
        calls[run_id] = calls.get(run_id, 0) + 1
        if run_id == "poison":
            raise DeliveryError("rejected", permanent=True, status=422)
        if run_id == "flaky" and calls[run_id] == 1:
            raise DeliveryError("unavailable", status=503)
        if run_id == "slow" and lane == "lifecycle":  # holds the batch until a renewal
            _wait_for(lambda: renewed() >= 1, "a lease renewal")

    for run_id in ("fine", "flaky", "poison", "slow"):
        client.enqueue_run(run_id)
    client.append_events("fine", [{"type": "log", "lane": "observability"} for _ in range(4)])
    relay = Relay(client, sink, batch_size=100, lease_seconds=5, max_sleep=0.05,
                  metrics=registry)  # fmt: skip

    def settled() -> bool:
        row = db.execute(
            "SELECT count(*) FILTER (WHERE state = 'delivered'),"
            " count(*) FILTER (WHERE state = 'failed') FROM runrelay.ledger"
        ).fetchone()
        return row == (7, 1)

    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        _wait_for(settled, "every event delivered but the poison one")
    finally:
        relay.stop()
        thread.join(60)
    assert not thread.is_alive()

    def value(name: str, **labels: str) -> float:
        return registry_value(registry, name, **labels)

    assert value("runrelay_relay_events_delivered_total", lane="lifecycle") == 3
    assert value("runrelay_relay_events_delivered_total", lane="observability") == 4
    total_delivered = sum(
        value("runrelay_relay_events_delivered_total", lane=lane)
        for lane in ("lifecycle", "observability")
    )
    assert total_delivered == relay.stats["delivered"]
    deliveries = value("runrelay_relay_deliveries_total", lane="lifecycle") + value(
        "runrelay_relay_deliveries_total", lane="observability"
    )
    assert deliveries == relay.stats["batches"] == 4
    failures = "runrelay_relay_delivery_failures_total"
    assert value(failures, lane="lifecycle", outcome="retrying") == 1
    assert value(failures, lane="lifecycle", outcome="blocked") == 1
    assert renewed() >= 1
    duration = "runrelay_relay_delivery_duration_seconds_count"
    assert value(duration, lane="lifecycle", result="ok") == 3
    assert value(duration, lane="lifecycle", result="error") == 2
    assert value(duration, lane="observability", result="ok") == 1
    assert value("runrelay_relay_lost_leases_total", lane="lifecycle") == 0


def test_loop_commands_serve_their_metrics_with_metrics_port(
    db: psycopg.Connection, db_url: str, client: Client, tmp_path: Path
) -> None:
    for i in range(2):
        client.enqueue_run(f"m{i}")
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RR_TEST_RECORD": str(tmp_path / "record.jsonl"),
        "PYTHONPATH": f"{REPO / 'tests' / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    worker_port, relay_port = _free_port(), _free_port()
    local = ["--metrics-host", "127.0.0.1", "--metrics-port"]
    worker = _cli(
        "worker", "loop_handlers:record", "--poll-interval", "0.1", *local, str(worker_port),
        env=env,
    )  # fmt: skip
    relay = _cli(
        "relay", "--jsonl", str(tmp_path / "events.jsonl"), "--lanes", "lifecycle",
        *local, str(relay_port), env=env,
    )  # fmt: skip
    try:
        _wait_for(_serving(worker_port, worker), "the worker serves metrics")
        _wait_for(_serving(relay_port, relay), "the relay serves metrics")

        def completed() -> float | None:
            return scrape(worker_port).get(
                "runrelay_worker_outcomes_total",
                queue="default", write="complete", outcome="completed",
            )  # fmt: skip

        def delivered() -> float | None:
            return scrape(relay_port).get("runrelay_relay_events_delivered_total", lane="lifecycle")

        _wait_for(lambda: completed() == 2, "the worker completed both runs")
        # run.queued, run.started, run.completed for each run.
        _wait_for(lambda: delivered() == 6, "the relay delivered every event")
        # The process's own metrics come along (prometheus_client's default registry).
        assert scrape(worker_port).get("process_cpu_seconds_total") is not None
        _stop(worker)
        _stop(relay)
    finally:
        for proc in (worker, relay):
            if proc.poll() is None:
                proc.kill()


# The first scrape of a loop command's port already lists the loop's metrics:
# they are registered before the port opens, not when the loop is built, so
# a scrape that lands in between (a loaded machine) is not missing them.
_SERVE_THEN_WAIT = """
import argparse, sys, time
from runrelay.cli.loops import _loop_metrics
args = argparse.Namespace(metrics_host="127.0.0.1", metrics_port=int(sys.argv[1]))
_loop_metrics(args, sys.argv[2])
print("serving", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize(
    ("loop", "family"),
    [("worker", "runrelay_worker_runs_claimed"), ("relay", "runrelay_relay_events_delivered")],
)
def test_a_loop_commands_first_scrape_lists_the_loops_metrics(loop: str, family: str) -> None:
    port = _free_port()
    # Nothing builds the loop in this process: what the page lists came from
    # serving the metrics alone.
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE_THEN_WAIT, str(port), loop],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "serving\n", proc.communicate()[1][-3000:]
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
        assert f"# HELP {family}_total " in page
        assert "process_cpu_seconds_total" in page
        assert "_created" not in page
    finally:
        proc.kill()
        proc.communicate()


# -- the dashboard --------------------------------------------------------------
def _series_names(registries: Sequence[CollectorRegistry]) -> set[str]:
    """Every series name the families of `registries` can expose."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
    names = set()
    for registry in registries:
        for family in registry.collect():
            for suffix in suffixes.get(family.type, [""]):
                names.add(family.name + suffix)
    return names


def test_the_dashboard_and_the_docs_use_only_metrics_that_exist(exporter: Exporter) -> None:
    loops = CollectorRegistry()
    WorkerMetrics.of(loops)
    RelayMetrics.of(loops)
    known = _series_names([loops, exporter.registry])
    assert {n for n in known if not n.startswith("runrelay_")} == set()

    dashboard = json.loads((REPO / "docs" / "grafana" / "runrelay.json").read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs, "the dashboard has no queries"
    used = {name for expr in exprs for name in re.findall(r"\brunrelay_[a-z_]+", expr)}
    assert used - known == set(), "the dashboard queries metrics nobody exports"
    # Every metric is on the dashboard, so none is exported for nothing.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    exported = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in known}
    assert exported - families == set(), "metrics missing from the dashboard"

    # The tables of docs/operations.md, Metrics, name exactly the metrics there are.
    operations = (REPO / "docs" / "operations.md").read_text()
    section = operations.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(runrelay_[a-z_]+)`", section, re.MULTILINE))
    assert {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in documented} == exported
