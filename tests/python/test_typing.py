"""A user's type checker sees what Client and AsyncClient methods return.

The methods are written once for both classes (runrelay.client._Methods); this
checks that the result types still reach a user: a small program using the
client as the docs do is type-checked by mypy --strict in a subprocess, with
`reveal_type` on representative results, and a second program with wrong
calls must be rejected line by line. Nothing here runs the programs, so no
database is needed; tests/python/test_client.py checks that the values at run
time are what the methods declare.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import runrelay

pytestmark = pytest.mark.package  # one leg of make test runs these (pyproject.toml)

# Each `reveal_type` line follows a `# reveals <type>` comment: the type mypy
# must reveal, written without the `builtins.` prefix older mypy versions print.
GOOD = '''
import asyncio
import uuid
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from runrelay import AsyncClient, Client, ClaimedAttempt, EnqueueResult


def produce(conn: psycopg.Connection[Any]) -> None:
    pool = ConnectionPool("postgresql:///app", open=False)
    client = Client(pool)
    # reveals runrelay.types.EnqueueResult
    reveal_type(client.enqueue_run("r1", payload={"k": 1}))
    claimed = client.claim_attempts("w1", queues=["default"], max_runs=4)
    # reveals list[runrelay.types.ClaimedAttempt]
    reveal_type(claimed)
    attempt = claimed[0]
    # reveals runrelay.types.CompleteOutcome
    reveal_type(client.complete_attempt(**attempt.fence, result={"ok": True}))
    # reveals runrelay.types.HeartbeatResult
    reveal_type(client.heartbeat(attempt.run_id, attempt.attempt, attempt.lease_token, conn=conn))
    # reveals datetime.datetime | None
    reveal_type(client.ledger_next_due_at(lane="lifecycle"))
    # reveals runrelay.types.RunnerTerminal | None
    reveal_type(client.read_runner_terminal("r1", 1))
    # reveals int
    reveal_type(client.release_ledger("relay-1", [1, 2]))
    # reveals bool
    reveal_type(client.requeue_ledger_event(7))
    # reveals list[runrelay.types.RunSummary]
    reveal_type(client.list_runs(status="failed", max_rows=10))
    # reveals runrelay.types.RunDetail | None
    reveal_type(client.get_run("r1"))
    # reveals runrelay.types.EnqueueResult
    reveal_type(Client.enqueue_run(client, "r2"))
    with Client(conn) as own:
        # reveals str
        reveal_type(own.get_schema_version(conn=conn))
        # reveals list[dict[str, Any]]
        reveal_type(own.run_stats())


async def consume() -> None:
    pool = AsyncConnectionPool("postgresql:///app", open=False)
    client = AsyncClient(pool)
    # reveals typing.Coroutine[Any, Any, runrelay.types.EnqueueResult]
    pending = reveal_type(client.enqueue_run("r1"))
    pending.close()
    # reveals runrelay.types.EnqueueResult
    reveal_type(await client.enqueue_run("r1", run_at=datetime.now()))
    claimed = await client.claim_attempts("w1", call_id=uuid.uuid4())
    # reveals list[runrelay.types.ClaimedAttempt]
    reveal_type(claimed)
    # reveals list[runrelay.types.CompletedItem]
    reveal_type(await client.complete_attempts(claimed))
    # reveals list[runrelay.types.LedgerEvent]
    reveal_type(await client.claim_ledger("relay-1", max_events=10))
    task = asyncio.create_task(client.cancel_run("r1", "no longer needed"))
    # reveals runrelay.types.CancelOutcome
    reveal_type(await task)
    async with AsyncClient("postgresql:///app") as own:
        # reveals int
        reveal_type(await own.prune(datetime.now()))


class LossyClient(Client):
    """A subclass that wraps one method, as tests and users do."""

    def claim_attempts(self, *args: Any, **kwargs: Any) -> list[ClaimedAttempt]:
        return super().claim_attempts(*args, **kwargs)


def typed_assignments(client: Client) -> EnqueueResult:
    result: EnqueueResult = client.enqueue_run("r3")
    return result
'''

# Each line marked `# error` must be reported by mypy.
BAD = """
from datetime import datetime

from runrelay import AsyncClient, Client, EnqueueResult


def wrong(client: Client, aclient: AsyncClient) -> None:
    client.enqueue_run(123)  # error
    client.enqueue_run("r1", priorty=5)  # error
    client.claim_attempts("w1", max_runs="4")  # error
    client.prune(delivered_before="yesterday")  # error
    status: str = client.cancel_run("r1").no_such_attribute  # error
    due: datetime = client.ledger_next_due_at()  # error
    client.get_schema_version("runrelay")  # error


async def wrong_async(aclient: AsyncClient) -> None:
    result: EnqueueResult = aclient.enqueue_run("r1")  # error
    await aclient.heartbeat("r1", "1", "token")  # error
    count: str = await aclient.release_ledger("relay-1", [1])  # error
"""

NOTE = re.compile(r"^(good|bad)\.py:(\d+): (error|note): (.*)$")
REVEALED = re.compile(r'^Revealed type is "(.*)"$')


def _marked(source: str, marker: str) -> dict[int, str]:
    """Line number -> what follows `marker` on that line."""
    out = {}
    for number, line in enumerate(source.splitlines(), start=1):
        if marker in line:
            out[number] = line.split(marker, 1)[1].strip()
    return out


def _reveals(source: str) -> dict[int, str]:
    """Line number of each `reveal_type` -> the type its comment expects."""
    return {line + 1: text for line, text in _marked(source, "# reveals ").items()}


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str, str]]]:
    """mypy --strict on both programs, in one run, with runrelay taken from
    the package these tests import (this checkout) and with no project config."""
    work = tmp_path_factory.mktemp("typing")
    (work / "good.py").write_text(textwrap.dedent(GOOD), encoding="utf-8")
    (work / "bad.py").write_text(textwrap.dedent(BAD), encoding="utf-8")
    (work / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    package_root = Path(runrelay.__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "mypy.ini",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(work / ".mypy_cache"),
            "--python-executable",
            sys.executable,
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            "good.py",
            "bad.py",
        ],
        cwd=work,
        env={**os.environ, "MYPYPATH": str(package_root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    notes: dict[str, list[tuple[int, str, str]]] = {"good": [], "bad": []}
    for line in proc.stdout.splitlines():
        match = NOTE.match(line)
        assert match, f"unexpected mypy output: {line}\n{proc.stdout}{proc.stderr}"
        notes[match[1]].append((int(match[2]), match[3], match[4]))
    return notes


def test_the_user_program_type_checks_cleanly(
    mypy_output: dict[str, list[tuple[int, str, str]]],
) -> None:
    errors = [n for n in mypy_output["good"] if n[1] == "error"]
    assert errors == []


def test_sync_and_async_results_have_their_declared_types(
    mypy_output: dict[str, list[tuple[int, str, str]]],
) -> None:
    expected = _reveals(textwrap.dedent(GOOD))
    revealed = {}
    for line, kind, text in mypy_output["good"]:
        match = REVEALED.match(text)
        if kind == "note" and match:
            revealed[line] = match[1]
    assert len(expected) >= 10
    assert revealed == expected


def test_wrong_calls_are_type_errors(
    mypy_output: dict[str, list[tuple[int, str, str]]],
) -> None:
    expected = set(_marked(textwrap.dedent(BAD), "# error"))
    reported = {line for line, kind, _ in mypy_output["bad"] if kind == "error"}
    assert reported == expected, mypy_output["bad"]
