"""Checks of the scheduler's state machine over a finished database, shared by
the randomized and fault-injection suites."""

from __future__ import annotations

from collections import defaultdict

import psycopg

TERMINAL = {"run.completed", "run.failed", "run.cancelled"}
# The run's state after each lifecycle event, from the state before it.
TRANSITIONS: dict[str, dict[str, str]] = {
    "new": {"run.queued": "queued"},
    "queued": {"run.started": "running", "run.cancelled": "end"},
    "running": {
        "run.completed": "end",
        "run.failed": "end",
        "run.cancelled": "end",
        "run.retry_scheduled": "queued",
        "run.waiting": "waiting",
    },
    "waiting": {
        "run.resumed": "maybe_queued",
        "run.cancelled": "end",
        "run.failed": "end",
        "run.retry_scheduled": "queued",
        "run.completed": "end",
    },
    # A detached wait's run.resumed (claim_detached_terminal) leaves the run
    # waiting for its owner's terminal; any other resume queues it. A claimed
    # terminal whose lease lapsed is reaped back to waiting (no event), and
    # resumes again: claimed anew, or woken once its claim window is over.
    "maybe_queued": {
        "run.resumed": "maybe_queued",
        "run.started": "running",
        "run.cancelled": "end",
        "run.completed": "end",
        "run.failed": "end",
        "run.retry_scheduled": "queued",
    },
    # An operator's retry_run queues a failed or cancelled run again.
    "end": {"run.retried": "queued"},
}
FINAL = {"queued": "queued", "running": "running", "waiting": "waiting"}


def check_database(conn: psycopg.Connection) -> dict[str, int]:
    """Assert every invariant of the scheduler tables; return run counts by status."""
    bad = conn.execute(
        """
        SELECT r.run_id FROM runrelay.runs AS r
        WHERE (SELECT count(*) FROM runrelay.attempts AS a
               WHERE a.run_id = r.run_id AND a.status IN ('running', 'waiting')) > 1
        """
    ).fetchall()
    assert bad == [], f"more than one live attempt: {bad}"
    bad = conn.execute(
        """
        SELECT r.run_id FROM runrelay.runs AS r
        WHERE r.attempt_count <> (SELECT count(*) FROM runrelay.attempts AS a
                                  WHERE a.run_id = r.run_id)
           OR r.attempt_count <> coalesce((SELECT max(a.attempt) FROM runrelay.attempts AS a
                                           WHERE a.run_id = r.run_id), 0)
        """
    ).fetchall()
    assert bad == [], f"attempt numbers not dense: {bad}"
    bad = conn.execute(
        """
        SELECT a.run_id, a.attempt, a.status, r.status FROM runrelay.attempts AS a
        JOIN runrelay.runs AS r USING (run_id)
        WHERE a.status IN ('running', 'waiting')
          AND (r.status NOT IN ('running', 'waiting') OR a.attempt <> r.attempt_count)
        """
    ).fetchall()
    assert bad == [], f"live attempt of a run that is not running: {bad}"
    # The failure budget counts failed and lost attempts only (released and
    # resumed ones are free), of the run's current attempt series (the
    # attempts after series_start: retry_run starts a new one): a failed run
    # spent exactly max_attempts of them, and no run ever spends more.
    bad = conn.execute(
        """
        SELECT r.run_id, r.status, r.max_attempts, f.spent FROM runrelay.runs AS r
        CROSS JOIN LATERAL (SELECT count(*) AS spent FROM runrelay.attempts AS a
                            WHERE a.run_id = r.run_id AND a.attempt > r.series_start
                              AND a.status IN ('failed', 'lost')) AS f
        WHERE f.spent > r.max_attempts OR (r.status = 'failed' AND f.spent <> r.max_attempts)
        """
    ).fetchall()
    assert bad == [], f"failure budget not max_attempts failed or lost attempts: {bad}"
    bad = conn.execute(
        """
        SELECT run_id FROM runrelay.ledger
        GROUP BY run_id HAVING count(*) <> count(DISTINCT seq)
        """
    ).fetchall()
    assert bad == [], f"duplicate seq: {bad}"

    history: dict[str, list[str]] = defaultdict(list)
    for run_id, kind in conn.execute(
        "SELECT run_id, type FROM runrelay.ledger WHERE lane = 'lifecycle'"
        " AND type LIKE 'run.%%' ORDER BY run_id, seq"
    ):
        history[run_id].append(kind)
    statuses: dict[str, int] = defaultdict(int)
    for run_id, status in conn.execute("SELECT run_id, status FROM runrelay.runs"):
        state = "new"
        for kind in history[run_id]:
            nxt = TRANSITIONS[state].get(kind)
            assert nxt is not None, f"{run_id}: {kind} after state {state}: {history[run_id]}"
            state = nxt
        if state == "end":
            assert status in ("completed", "failed", "cancelled"), (run_id, status)
            expected_event = {
                "completed": "run.completed",
                "failed": "run.failed",
                "cancelled": "run.cancelled",
            }[status]
            assert history[run_id][-1] == expected_event, (run_id, history[run_id])
        elif state == "maybe_queued":
            assert status in ("queued", "waiting"), (run_id, status, history[run_id])
        else:
            assert status == FINAL[state], (run_id, status, history[run_id])
        statuses[status] += 1
    return dict(statuses)


def check_lanes(conn: psycopg.Connection) -> None:
    """Assert every run lane's ledger_lanes row leads to its pending tail: no
    event is stranded behind a lane that says there is nothing to do."""
    bad = conn.execute(
        """
        SELECT p.run_id, p.lane, p.seq, p.state, p.transport_only,
               ll.head_seq, ll.available_at, ll.blocked
        FROM (
            SELECT DISTINCT ON (l.run_id, l.lane) l.run_id, l.lane, l.seq, l.state,
                   l.transport_only,
                   EXISTS (SELECT 1 FROM runrelay.ledger AS n
                           WHERE n.run_id = l.run_id AND n.lane = l.lane
                             AND n.state NOT IN ('delivered', 'skipped')
                             AND n.seq > l.seq) AS has_next
            FROM runrelay.ledger AS l
            WHERE l.state NOT IN ('delivered', 'skipped')
            ORDER BY l.run_id, l.lane, l.seq
        ) AS p
        LEFT JOIN runrelay.ledger_lanes AS ll ON ll.run_id = p.run_id AND ll.lane = p.lane
        WHERE ll.run_id IS NULL
           OR ll.head_seq IS NULL
           OR ll.head_seq > p.seq
           OR (p.state = 'failed') <> ll.blocked
           OR (p.state <> 'failed' AND ll.available_at IS NULL
               AND NOT (p.transport_only AND NOT p.has_next))
        """
    ).fetchall()
    assert bad == [], f"lanes that do not lead to their pending head: {bad[:5]}"


def drain_ledger(conn: psycopg.Connection, relay: str = "drain") -> int:
    """Deliver everything a relay can claim, as a relay discovering due lanes
    two hours from now (every lease lapsed, every retry and re-check due);
    return how many events it delivered. A discovery call looks at ten lanes
    at most, so only a few empty answers in a row mean the ledger is drained."""
    delivered = 0
    with conn.transaction():
        conn.execute("SET LOCAL runrelay.clock_offset = '2 hours'")
        for lane in ("lifecycle", "observability"):
            empty = 0
            while empty < 20:
                rows = conn.execute(
                    "SELECT event_id, run_id, kind FROM runrelay.claim_ledger("
                    " relay => %s, lane => %s, max_events => 100, batch => true)",
                    [relay, lane],
                ).fetchall()
                empty = 0 if rows else empty + 1
                ids = [r[0] for r in rows if r[2] == "claimed"]
                if ids:
                    conn.execute(
                        "SELECT count(*) FROM runrelay.ack_ledger("
                        " relay => %s, run_id => %s, event_ids => %s)",
                        [relay, rows[0][1], ids],
                    )
                delivered += len(rows)
    return delivered


def check_drained(conn: psycopg.Connection) -> None:
    """After drain_ledger: every event still pending is at or behind a failed
    one, or a transport-only head whose successor is failed or missing."""
    bad = conn.execute(
        """
        SELECT l.run_id, l.lane, l.seq, l.state FROM runrelay.ledger AS l
        WHERE l.state NOT IN ('delivered', 'skipped')
          AND NOT EXISTS (SELECT 1 FROM runrelay.ledger AS f
                          WHERE f.run_id = l.run_id AND f.lane = l.lane
                            AND f.state = 'failed' AND f.seq <= l.seq)
          AND NOT (l.transport_only AND coalesce((
                       SELECT n.state = 'failed' FROM runrelay.ledger AS n
                       WHERE n.run_id = l.run_id AND n.lane = l.lane
                         AND n.state NOT IN ('delivered', 'skipped') AND n.seq > l.seq
                       ORDER BY n.seq LIMIT 1), true))
        ORDER BY l.run_id, l.lane, l.seq
        """
    ).fetchall()
    assert bad == [], f"events no relay could claim: {bad[:5]}"
