-- Calls of signal_run, cancel_run, retry_run and skip_ledger_events made
-- with a call_id, and what they answered, so that the same call repeated
-- after a lost reply answers the same and writes nothing ("replays are
-- exact"). Claims
-- remember their call_id on the rows they take instead (attempts.call_id,
-- ledger.call_id).
--
-- A row is written in the transaction of the call's effect, and only when
-- the call changed something (a signal stored or delivered, a pending
-- cancellation applied, a cancel marker written or applied): a call that
-- changed nothing has nothing to repeat by mistake. skip_ledger_events is
-- the exception: it records not_blocked too, with the head it answered
-- (reply), because an operator who repeats a skip that found nothing to skip
-- must not skip a head that failed since. The record outlives the
-- effect's own rows (a stored signal is consumed, a marker is deleted when it
-- is applied, prune deletes delivered ledger events), so a repeat answers
-- the first outcome whatever happened to the run since.
--
-- call_id is unique per install: a repeat must name the same function, run
-- and arguments (kept as a digest: a payload need not be stored twice), or it
-- is refused with 22023. No foreign key to runs, for the reason the
-- cancellations table has none: its KEY SHARE check would queue cancel_run
-- behind a claim's row lock. purge_runs deletes a purged run's calls rows
-- (calls_run_id_idx, below); an operator who deletes runs by hand deletes
-- them too (see docs/scheduler.md).
CREATE TABLE calls (
    call_id uuid PRIMARY KEY,
    function_name text NOT NULL,
    run_id text NOT NULL,
    arguments_digest bytea NOT NULL,
    outcome text NOT NULL,
    called_at timestamptz NOT NULL,
    -- The row a set-returning call answered when its effect's rows cannot
    -- give it again: skip_ledger_events' not_blocked (the head's event_id
    -- and seq, or nulls). Null for every other call.
    reply jsonb,
    CONSTRAINT calls_outcome CHECK (
        (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
        OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
        OR (function_name = 'retry_run' AND outcome = 'retried')
        OR (function_name = 'skip_ledger_events' AND outcome IN ('skipped', 'not_blocked'))
    ),
    CONSTRAINT calls_reply CHECK (reply IS NULL OR outcome = 'not_blocked'),
    CONSTRAINT calls_arguments_digest CHECK (octet_length(arguments_digest) = 32)
);

-- purge_runs: the calls of the runs it deletes. A call with a call_id writes
-- one more index entry; calls without one (most) write no row at all.
CREATE INDEX calls_run_id_idx ON calls (run_id);
