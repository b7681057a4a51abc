"""Crash recovery and shutdown of the loops as users run them: `runrelay
worker` and `runrelay relay` processes against a real server, SIGKILLed or
signalled twice. No test process calls reap_expired: a killed worker's runs
come back only through the surviving worker's built-in maintenance, and a
killed relay's events through lease expiry.

The invariant checker of faults.py runs on the final tables and the
consumer's receipts (no call history: the CLI processes do not record one),
which covers what is derivable from them — the state machine of every run
(I2/I7), per-run delivery order and nothing acknowledged but undelivered (I3).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import handed_back
from faults import Checker, read_jsonl, wait_for
from installed import Installed
from runrelay import Client

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Processes:
    """`runrelay` CLI processes of one test, run from the wheel installed in a
    fresh venv (what a user runs); any still alive are killed at the end."""

    def __init__(self, db_url: str, folder: Path, installed: Installed) -> None:
        self.folder = folder
        self.installed = installed
        self.env = installed.env(
            DATABASE_URL=db_url,
            PYTHONPATH=str(HERE),  # the test handlers and sinks, nothing of runrelay
            RR_TEST_RECORD=str(folder / "record.jsonl"),
        )
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.stderr", "wb") as err:
            proc = subprocess.Popen(
                [self.installed.runrelay, *args],
                env={**self.env, **env},
                cwd=self.installed.home,
                stdout=err,
                stderr=err,
            )
        self.procs.append(proc)
        return proc

    def stderr(self, name: str) -> str:
        return (self.folder / f"{name}.stderr").read_text(encoding="utf-8")

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.folder / "record.jsonl")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def procs(db_url: str, tmp_path: Path, installed: Installed) -> Iterator[Processes]:
    p = Processes(db_url, tmp_path, installed)
    yield p
    p.close()


def _statuses(db: psycopg.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())


def _check_invariants(db: psycopg.Connection, sink: list[dict[str, Any]] | None = None) -> None:
    report = Checker([], db, sink=sorted(sink or [], key=lambda r: r["w"])).run()
    assert report.violations == [], str(report)


def test_a_sigkilled_workers_runs_are_reaped_and_rerun_by_its_peer(
    db: psycopg.Connection, db_url: str, procs: Processes
) -> None:
    client = Client(db_url)
    # Three runs that hang on their first attempt (A takes them), then quick ones.
    for i in range(3):
        client.enqueue_run(f"hang{i}", payload={"sleep": 120, "sleep_on": [1]}, max_attempts=3)
    worker = ("worker", "loop_handlers:record", "--lease-seconds", "5", "--poll-interval", "0.2")
    a = procs.start("a", *worker, "--concurrency", "3", "--name", "A")
    wait_for(lambda: _statuses(db) == dict.fromkeys(("hang0", "hang1", "hang2"), "running"),
             timeout=60, what="A holds the three runs")  # fmt: skip
    b = procs.start("b", *worker, "--concurrency", "2", "--name", "B", "--log-format", "json")
    for i in range(5):
        client.enqueue_run(f"quick{i}", payload={})
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)

    wait_for(lambda: set(_statuses(db).values()) == {"completed"}, timeout=90,
             what="every run completed")  # fmt: skip
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0

    attempts = db.execute(
        "SELECT run_id, attempt, status, worker, error->>'reason' FROM runrelay.attempts"
        " WHERE run_id LIKE 'hang%' ORDER BY run_id, attempt"
    ).fetchall()
    assert attempts == [
        row
        for i in range(3)
        for row in (
            (f"hang{i}", 1, "lost", "A", "lease_expired"),
            (f"hang{i}", 2, "completed", "B", None),
        )
    ]
    # A started each hanging run and never ended it; B ran it again to the end.
    ends = {(r["run_id"], r["attempt"]) for r in procs.records() if r["ev"] == "end"}
    starts = {(r["run_id"], r["attempt"]) for r in procs.records() if r["ev"] == "start"}
    assert {(f"hang{i}", 1) for i in range(3)} <= starts - ends
    assert {(f"hang{i}", 2) for i in range(3)} <= ends
    _check_invariants(db)

    # B's per-job log lines are JSON with the run's fields.
    lines = [json.loads(x) for x in procs.stderr("b").splitlines() if x.startswith("{")]
    finished = {(x["run_id"], x["attempt"]): x for x in lines if x["message"] == "run finished"}
    assert {(f"hang{i}", 2) for i in range(3)} <= set(finished)
    for line in finished.values():
        assert line["logger"] == "runrelay.worker"
        assert line["level"] == "INFO"
        assert line["queue"] == "default"
        assert line["outcome"] == "completed"
        assert isinstance(line["duration_ms"], int) and line["duration_ms"] >= 0


def test_a_sigkilled_relays_leased_events_are_delivered_by_another_in_order(
    db: psycopg.Connection, db_url: str, procs: Processes, tmp_path: Path
) -> None:
    client = Client(db_url)
    for i in range(4):
        client.enqueue_run(f"r{i}")
        client.append_events(f"r{i}", [{"type": "step", "payload": {"k": k}} for k in range(6)])
    relay = ("relay", "--sink", "loop_handlers:slow_sink", "--lease-seconds", "5",
             "--batch-size", "3", "--lanes", "lifecycle")  # fmt: skip
    sink_a, sink_b = tmp_path / "sink_a.jsonl", tmp_path / "sink_b.jsonl"
    a = procs.start("relay_a", *relay, "--name", "A", RR_TEST_SINK=str(sink_a),
                    RR_TEST_SINK_DELAY="120", RR_TEST_NAME="A")  # fmt: skip
    wait_for(lambda: bool(read_jsonl(sink_a)), timeout=60, what="A delivering a batch")
    held = db.execute(
        "SELECT delivery_key FROM runrelay.ledger WHERE state = 'leased' AND lease_owner = 'A'"
    ).fetchall()
    assert held, "A holds leases while its sink is slow"
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)

    b = procs.start("relay_b", *relay, "--name", "B", RR_TEST_SINK=str(sink_b), RR_TEST_NAME="B")
    undelivered = "SELECT count(*) FROM runrelay.ledger WHERE state <> 'delivered'"
    wait_for(lambda: db.execute(undelivered).fetchone() == (0,), timeout=90,
             what="every event delivered")  # fmt: skip
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0

    received_b = read_jsonl(sink_b)
    keys_b = [k for r in received_b for k in r["keys"]]
    assert {k for (k,) in held} <= set(keys_b), "B delivered what A held when it died"
    expected = db.execute(
        "SELECT delivery_key FROM runrelay.ledger WHERE NOT acked_locally"
    ).fetchall()
    assert {k for (k,) in expected} == set(keys_b) | {
        k for r in read_jsonl(sink_a) for k in r["keys"]
    }
    for run in {r["run_id"] for r in received_b}:  # B's own output: per-run seq order
        seqs = [s for r in received_b if r["run_id"] == run for s in r["seqs"]]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)), (run, seqs)
    _check_invariants(db, read_jsonl(sink_a) + received_b)


def test_a_second_signal_ends_the_grace_period_and_hands_the_run_back(
    db: psycopg.Connection, db_url: str, procs: Processes
) -> None:
    Client(db_url).enqueue_run("long", payload={"sleep": 300}, max_attempts=3)
    w = procs.start("w", "worker", "loop_handlers:record", "--shutdown-grace", "300",
                    "--poll-interval", "0.2", "--name", "W")  # fmt: skip
    wait_for(lambda: _statuses(db) == {"long": "running"}, timeout=60, what="the run started")
    wait_for(lambda: bool(procs.records()), timeout=30, what="the handler started")

    w.send_signal(signal.SIGTERM)
    wait_for(lambda: "waiting up to 300.0s for 1 in-flight runs" in procs.stderr("w"),
             timeout=30, what="the first signal acknowledged")  # fmt: skip
    assert w.poll() is None, "the worker waits for its handler"
    assert _statuses(db) == {"long": "running"}
    assert [r["ev"] for r in procs.records()] == ["start"]

    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    # Handed back without using an attempt.
    status, attempt, reason = handed_back(db, "long")
    assert (status, attempt) == ("queued", "released")
    assert reason.startswith("WorkerShutdown: ")
    log = procs.stderr("w")
    assert "SIGTERM: no new claims" in log
    assert "SIGTERM again: handing in-flight runs back now" in log
    assert [r["ev"] for r in procs.records()] == ["start"]  # the handler never finished
