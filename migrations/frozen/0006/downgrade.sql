-- Undo revision 0006.
-- 0005 has no lane wake-ups: apply each one to its lane row (the head no
-- later than the wake-up's first event, available now) so 0005's relays
-- find the events (a blocked lane stays blocked: its failed head is
-- earlier), then drop the table. Runs before the resting-lanes
-- update below, which then sees the lanes as they are.
UPDATE ledger_lanes AS ll
SET
    head_seq = least(coalesce(ll.head_seq, w.first_seq), w.first_seq),
    available_at = least(ll.available_at, w.created_at)
FROM ledger_wakeups AS w
WHERE ll.run_id = w.run_id AND ll.lane = w.lane AND NOT ll.blocked;

DROP TABLE ledger_wakeups;

-- 0005 lets a transport-only head without a successor rest: its lane has
-- available_at NULL until an append wakes it. Put such lanes back to rest so
-- that 0005's relays do not keep discovering a lane they will not claim.
-- (Rows 0006 wrote are otherwise valid for 0005: local acks it made, with
-- payloads dropped and call ids set, are ordinary delivered rows.)
UPDATE ledger_lanes AS ll
SET available_at = NULL
WHERE
    ll.available_at IS NOT NULL
    AND EXISTS (
        SELECT 1 FROM ledger AS h
        WHERE
            h.run_id = ll.run_id AND h.lane = ll.lane AND h.seq = ll.head_seq
            AND h.state = 'pending' AND h.transport_only
    )
    AND NOT EXISTS (
        SELECT 1 FROM ledger AS n
        WHERE
            n.run_id = ll.run_id AND n.lane = ll.lane AND n.state <> 'delivered'
            AND n.seq > ll.head_seq
    );

-- Revision 0005's signal_run and cancel_run take no call_id, so their call
-- records go. Every other row is valid for 0005 as it is. After an upgrade
-- back to 0006 a repeat of a call made before the downgrade is decided afresh
-- (a signal may be stored twice), as it was under 0005.
DROP TABLE calls;

-- ---------------------------------------------------------------------------
-- Detached-runner terminals lose 0006's claim window.
-- 0006 keeps a waiting run with a pushed terminal under a deadline (its claim
-- window; see upgrade.sql). 0005 has none: its record_runner_terminal sets
-- wake_at NULL and its claim_detached_terminal ignores wake_at, so a window
-- left in place would let 0005's claims wake the run {"timed_out": true} —
-- dropping the pushed result, and fencing out an owner that claimed it
-- meanwhile. Disarm it on every waiting detached run whose current attempt
-- holds a pushed terminal, as 0005 would have left it (a claimed one already
-- has none). A detached wait without a pushed terminal keeps its timeout_at.
UPDATE runs AS r
SET wake_at = NULL
FROM attempts AS a
WHERE
    r.status = 'waiting' AND r.wait ->> 'kind' = 'detached_runner'
    AND r.wake_at IS NOT NULL
    AND a.run_id = r.run_id AND a.attempt = r.attempt_count
    AND a.runner_result_received_at IS NOT NULL;
-- ---------------------------------------------------------------------------
