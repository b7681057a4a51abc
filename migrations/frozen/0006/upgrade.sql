-- Revision 0006: a transport-only head no longer rests; call records for
-- exact replays of signal_run and cancel_run.
-- Under 0005 a lane whose head was a transport-only event without a
-- successor had available_at NULL without being blocked (resting), and only
-- an append woke it. From 0006 such a head is acknowledged locally by the
-- next claim of its lane, so its lane is available like any other: at its
-- head's due time. Lanes that are empty (head_seq NULL) or blocked keep
-- available_at NULL.
UPDATE ledger_lanes AS ll
SET
    available_at = (
        SELECT l.next_attempt_at
        FROM ledger AS l
        WHERE
            l.run_id = ll.run_id AND l.lane = ll.lane AND l.state <> 'delivered'
            AND l.seq >= ll.head_seq
        ORDER BY l.seq
        LIMIT 1
    )
WHERE ll.available_at IS NULL AND NOT ll.blocked AND ll.head_seq IS NOT NULL;

-- Exact replays of signal_run and cancel_run.
-- Calls made with a call_id record what they answered (see
-- plpgsql/schema/07_calls.sql). A new table: no existing row is touched.
CREATE TABLE calls (
    call_id uuid PRIMARY KEY,
    function_name text NOT NULL,
    run_id text NOT NULL,
    arguments_digest bytea NOT NULL,
    outcome text NOT NULL,
    called_at timestamptz NOT NULL,
    CONSTRAINT calls_outcome CHECK (
        (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
        OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
    ),
    CONSTRAINT calls_arguments_digest CHECK (octet_length(arguments_digest) = 32)
);

-- Lane wake-ups an appender could not write on a lane row a relay held
-- (plpgsql/schema/06_ledger.sql). A new table: no existing row is touched.
CREATE TABLE ledger_wakeups (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lane text NOT NULL,
    first_seq bigint NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, lane),
    CONSTRAINT ledger_wakeups_lane CHECK (lane IN ('lifecycle', 'observability'))
);

-- Discovery and ledger_next_due_at take the oldest wake-up of a lane.
CREATE INDEX ledger_wakeups_lane_idx ON ledger_wakeups (lane, created_at);

-- ---------------------------------------------------------------------------
-- Detached-runner terminals pushed under 0005 get 0006's claim window.
-- 0005's record_runner_terminal disarmed the run's deadline (wake_at NULL)
-- until the owner claimed the terminal, so a terminal nobody claims kept its
-- run waiting forever. 0006 bounds the claim (_wake_at in
-- plpgsql/_internal/wait.sql): the deadline is 5 minutes after the push, or
-- the wait's timeout_at if that is sooner; past it the next claim wakes the
-- run with the pushed result in its resume. Such runs get exactly that
-- deadline here (computed inline: 0006's functions are installed after this
-- file runs), even when it has already passed. A terminal already claimed
-- (claim_detached_terminal succeeded: the attempt is running under the
-- owner's lease) keeps no deadline, as under 0006: the lease governs, and
-- reap_expired restores the window if the lease lapses.
UPDATE runs AS r
SET
    wake_at = least(
        (r.wait ->> 'timeout_at')::timestamptz,
        a.runner_result_received_at + interval '5 minutes'
    )
FROM attempts AS a
WHERE
    r.status = 'waiting' AND r.wait ->> 'kind' = 'detached_runner'
    AND a.run_id = r.run_id AND a.attempt = r.attempt_count
    AND a.status = 'waiting' AND a.runner_result_received_at IS NOT NULL;
-- ---------------------------------------------------------------------------
