-- get_run(): one run as an operator needs to see it: every column of the
-- run (series_start: the attempts after it are the current attempt series,
-- see retry_run; trace_context: the W3C trace context it was enqueued
-- with, see run_trace_context), and whether a cancellation is pending (a
-- cancel marker no writer has applied yet). cancel_reason is the pending
-- marker's reason, or, once a cancellation ended the run, the reason it was
-- cancelled for.
--
-- No row when the run does not exist. Reads only: one primary-key probe of
-- runs and one of cancellations, no lock, no write.
CREATE TYPE run_detail AS (
    run_id text,
    queue text,
    status text,
    priority integer,
    concurrency_key text,
    key_held boolean,
    payload jsonb,
    payload_retention text,
    run_at timestamptz,
    max_attempts integer,
    attempt_count integer,
    series_start integer,
    wait jsonb,
    wake_at timestamptz,
    resume jsonb,
    result jsonb,
    error jsonb,
    created_at timestamptz,
    updated_at timestamptz,
    finished_at timestamptz,
    trace_context jsonb,
    cancel_requested boolean,
    cancel_reason text,
    task text
);

CREATE FUNCTION get_run(run_id text)
RETURNS SETOF run_detail
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', get_run.run_id);
    RETURN QUERY
    SELECT
        r.run_id, r.queue, r.status, r.priority, r.concurrency_key, r.key_held, r.payload,
        r.payload_retention, r.run_at, r.max_attempts, r.attempt_count, r.series_start, r.wait, r.wake_at, r.resume,
        r.result, r.error, r.created_at, r.updated_at, r.finished_at, r.trace_context,
        c.run_id IS NOT NULL, coalesce(c.reason, r.cancel_reason), r.task
    FROM runs AS r
    LEFT JOIN cancellations AS c ON r.run_id = c.run_id
    WHERE r.run_id = get_run.run_id;
END;
$$;

COMMENT ON FUNCTION get_run(text) IS
'One run with every column and its pending cancellation, if any; no row when it does not exist.';
