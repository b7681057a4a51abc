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
