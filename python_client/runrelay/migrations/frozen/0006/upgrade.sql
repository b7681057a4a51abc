-- Revision 0006: exact replays of signal_run and cancel_run.
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
