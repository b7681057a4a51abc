"""What a new user meets first: the names a Python program imports, calls
that need no round trip, times that cannot silently shift by hours,
listeners that stay on this host unless told otherwise, and a license file
that says what the package declares."""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import runrelay
from conftest import REPO
from runrelay import AsyncClient, Client, EnqueueItem
from runrelay.cli import build_parser

RUNRELAY = str(Path(sys.executable).with_name("runrelay"))


def test_the_application_model_imports_from_the_package() -> None:
    from runrelay import Task, Tasks

    assert Tasks is runrelay.tasks.Tasks and Task is runrelay.tasks.Task
    assert {"Task", "Tasks", "SkippedEvent", "SkipOutcome"} <= set(runrelay.__all__)


def test_enqueue_runs_of_nothing_is_no_runs_and_no_round_trip(
    db: psycopg.Connection, db_url: str
) -> None:
    calls: list[str] = []
    client = Client(db_url, on_call=lambda fn, _s: calls.append(fn))
    assert client.enqueue_runs([]) == []
    assert asyncio.run(AsyncClient(db_url).enqueue_runs([])) == []
    assert calls == []
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)


@pytest.mark.parametrize(
    "call",
    [
        lambda c, t: c.enqueue_run("naive", run_at=t),
        lambda c, t: c.enqueue_runs([EnqueueItem("naive", run_at=t)]),
        lambda c, t: c.enqueue_runs([{"run_id": "naive", "run_at": t}]),
        lambda c, t: c.retry_run("naive", run_at=t),
        lambda c, t: c.prune(t),
    ],
    ids=["enqueue_run", "enqueue_runs-item", "enqueue_runs-mapping", "retry_run", "prune"],
)
def test_a_naive_datetime_is_refused_before_anything_is_sent(
    db: psycopg.Connection, db_url: str, call: Any
) -> None:
    """A datetime without a time zone would be read in the server's zone;
    it is refused, naming the parameter, and nothing is written."""
    calls: list[str] = []
    client = Client(db_url, on_call=lambda fn, _s: calls.append(fn))
    naive = datetime.now() + timedelta(minutes=5)
    with pytest.raises(ValueError, match="must be a timezone-aware datetime"):
        call(client, naive)
    assert calls == []
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)
    # The same call with an aware time goes through.
    client.enqueue_run("aware", run_at=datetime.now(UTC) + timedelta(minutes=5))


@pytest.mark.parametrize("command", ["worker", "relay"])
def test_a_loops_metrics_listen_on_this_host_unless_told_otherwise(command: str) -> None:
    parser = build_parser()
    extra = ["json:loads"] if command == "worker" else ["--jsonl", "/dev/null"]
    args = parser.parse_args([command, *extra, "--metrics-port", "9100"])
    assert args.metrics_host == "127.0.0.1"
    args = parser.parse_args([command, *extra, "--metrics-port", "9100",
                              "--metrics-host", "0.0.0.0"])  # fmt: skip
    assert args.metrics_host == "0.0.0.0"


def test_the_license_file_is_the_declared_license() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    text = (REPO / "LICENSE").read_text()
    assert project["license"] == "Apache-2.0"  # an SPDX expression
    assert project["license-files"] == ["LICENSE"]
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_every_command_takes_its_schema_from_runrelay_schema(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RUNRELAY_SCHEMA is --schema's default for every command: an install
    in schema billing is migrated, filled and read without one --schema."""
    monkeypatch.setenv("RUNRELAY_SCHEMA", "billing")
    assert build_parser().parse_args(["status"]).schema == "billing"
    assert build_parser().parse_args(["status", "--schema", "other"]).schema == "other"
    env = {"DATABASE_URL": db_url, "RUNRELAY_SCHEMA": "billing", "PATH": "/usr/bin:/bin"}

    def runrelay_(*args: str) -> str:
        done = subprocess.run(
            [RUNRELAY, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    runrelay_("migrate")
    runrelay_("runs", "enqueue", "b1", "--queue", "invoices")
    assert "b1" in runrelay_("runs", "list")
    assert "invoices" in runrelay_("queues", "list")
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT queue FROM billing.runs WHERE run_id = 'b1'").fetchone()
    assert row == ("invoices",)


def _helps(parser: Any) -> Iterator[tuple[str, str]]:
    yield parser.prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _helps(sub)


def test_no_help_names_a_file_of_the_source_tree() -> None:
    """A user reads --help without the repository: it names commands, SQL
    functions and docs, never plpgsql/ sources, tests or the specification."""
    forbidden = re.compile(r"plpgsql/|\.sql\b|tests/|devtools|\bSPEC\b|python_client")
    seen = 0
    for prog, text in _helps(build_parser()):
        seen += 1
        assert not forbidden.search(text), (prog, forbidden.search(text))
    assert seen > 30  # every command and action was walked
