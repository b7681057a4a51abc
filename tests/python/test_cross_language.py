"""One install, two languages: runs enqueued from Python are run by the
TypeScript Worker and delivered by the Python Relay, and the reverse (a
TypeScript producer, the Python Worker, the TypeScript Relay). Both sides
record every call in one history format (tests/python/faults.py; the
TypeScript side is clients/typescript/test/fixtures/recorded.ts), and the
offline checker of the fault suite must find no violation of I1-I11
(docs/guarantees.md) in the merged history, the final database and the
consumer's log."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from faults import (
    REPO,
    Checker,
    Children,
    History,
    RecordingClient,
    load_history,
    load_sink,
)
from faults import wait_for as wait_until
from lifecycle import check_drained
from runrelay.demo import UNDELIVERED

pytest_plugins = ["conftest_faults"]

TS = REPO / "clients" / "typescript"
RUNS = 12
TERMINAL = "SELECT count(*) FROM runrelay.runs WHERE status IN ('completed', 'failed', 'cancelled')"


@pytest.fixture(scope="session")
def ts_build() -> Path:
    """The TypeScript package built (its npm packages from the lock file)."""
    subprocess.run(["bash", str(REPO / "scripts" / "ts_install.sh")], check=True, cwd=REPO)
    return TS / "build" / "test" / "fixtures" / "recorded.js"


class TsChildren:
    """TypeScript processes of one test, recording like faults.Children's."""

    def __init__(self, script: Path, url: str, folder: Path) -> None:
        self.script = script
        self.url = url
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.histories: list[Path] = []
        self.logs: list[Path] = []

    def spawn(self, role: str, name: str, *extra: str) -> subprocess.Popen[bytes]:
        history = self.folder / f"{name}.history.jsonl"
        log = self.folder / f"{name}.sink.jsonl"
        err = open(self.folder / f"{name}.stderr", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            ["node", str(self.script), role, "--url", self.url, "--name", name,
             "--history", str(history), "--log", str(log), *extra],
            stdout=err, stderr=err, cwd=TS,
        )  # fmt: skip
        err.close()
        self.procs.append(proc)
        self.histories.append(history)
        self.logs.append(log)
        return proc

    def stderr(self, name: str) -> str:
        path = self.folder / f"{name}.stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def ts_children(ts_build: Path, db_url: str, tmp_path: Path) -> Iterator[TsChildren]:
    kids = TsChildren(ts_build, db_url, tmp_path)
    yield kids
    for proc in kids.procs:
        if proc.poll() is None:
            proc.kill()


def _count(db: psycopg.Connection, query: str) -> int:
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _check(calls: list[dict[str, Any]], db: psycopg.Connection, sink: list[dict[str, Any]]) -> None:
    report = Checker(calls, db, sink=sink).run()
    assert report.violations == [], str(report)
    check_drained(db)


@pytest.mark.usefixtures("fast_retries")
def test_python_producer_typescript_worker_python_relay(
    db: psycopg.Connection,
    db_url: str,
    history: History,
    children: Children,
    ts_children: TsChildren,
) -> None:
    producer = RecordingClient(db_url, history, "py-producer")
    try:
        for i in range(RUNS):
            producer.enqueue_run(
                f"py-{i}", queue="cross", payload={"i": i, "fail_first": i % 4 == 0}
            )
            producer.append_events(f"py-{i}", [{"type": "order.placed", "payload": {"i": i}}])
    finally:
        producer.close()
    ts_children.spawn("worker", "ts-worker")
    relay = children.relay("py-relay", lease=5, batch=5)
    try:
        wait_until(lambda: _count(db, TERMINAL) == RUNS, 90, "every run ended")
        wait_until(lambda: _count(db, UNDELIVERED) == 0, 90, "every event delivered")
    except AssertionError:
        print(ts_children.stderr("ts-worker"), file=sys.stderr)
        raise
    finally:
        ts_children.stop()
        relay.terminate()
    rows = db.execute("SELECT run_id, status, result FROM runrelay.runs ORDER BY run_id").fetchall()
    assert {status for _, status, _ in rows} == {"completed"}, rows
    assert all(result["by"] == "ts-worker" for _, _, result in rows)
    calls, _ = load_history([history.path, *ts_children.histories, *children.histories()])
    assert {c["process"] for c in calls} >= {"py-producer", "ts-worker", "py-relay"}
    _check(calls, db, load_sink(children.logs()))


@pytest.mark.usefixtures("fast_retries")
def test_typescript_producer_python_worker_typescript_relay(
    db: psycopg.Connection,
    children: Children,
    ts_children: TsChildren,
) -> None:
    producer = ts_children.spawn("producer", "ts-producer", "--runs", str(RUNS), "--prefix", "ts")
    assert producer.wait(60) == 0, ts_children.stderr("ts-producer")
    worker = children.worker("py-worker", lease=5)
    ts_children.spawn("relay", "ts-relay")
    try:
        wait_until(lambda: _count(db, TERMINAL) == RUNS, 90, "every run ended")
        wait_until(lambda: _count(db, UNDELIVERED) == 0, 90, "every event delivered")
        time.sleep(0.2)
    except AssertionError:
        print(ts_children.stderr("ts-relay"), file=sys.stderr)
        raise
    finally:
        ts_children.stop()
        worker.terminate()
    rows = db.execute("SELECT status FROM runrelay.runs").fetchall()
    assert {status for (status,) in rows} == {"completed"}
    calls, _ = load_history([*ts_children.histories, *children.histories()])
    assert {c["process"] for c in calls} >= {"ts-producer", "py-worker", "ts-relay"}
    sink = load_sink(ts_children.logs)
    assert {r["run_id"] for r in sink} == {f"ts-{i}" for i in range(RUNS)}
    _check(calls, db, sink)
