-- claim_attempts(): take up to max_runs runnable runs and open an attempt on
-- each. The claim itself is _claim (_internal/claim.sql), which
-- settle_and_claim runs too; this validates the arguments and bounds the
-- lock wait.
--
-- Runnable (_runnable): status queued, run_at due, not held behind an earlier
-- run of its concurrency key; best first (priority DESC, run_at), locked
-- SKIP LOCKED, so concurrent claimers never wait on one another and never
-- take the same run. Waits whose time has come on these queues are woken
-- first. A candidate with a cancel marker is cancelled instead of started.
-- tasks: only runs whose task is one of these (null: any run, untyped ones
-- too), so a worker never claims a run it has no handler for; each result
-- row carries the run's task, and its recorded steps (null: none).
-- Replay: with call_id, a repeated call returns the attempts the first call
-- opened (for the same worker), in the same order, and opens nothing; if the
-- first call rolled back there is nothing to find and the call claims afresh.
CREATE FUNCTION claim_attempts(
    worker text,
    queues text[] DEFAULT NULL,
    max_runs integer DEFAULT 1,
    lease_seconds integer DEFAULT 30,
    call_id uuid DEFAULT NULL,
    tasks text[] DEFAULT NULL
)
RETURNS SETOF claim_attempts_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_queues text[];
    v_tasks text[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('worker', claim_attempts.worker);
    PERFORM _check_int('max_runs', claim_attempts.max_runs, 1, 1000);
    v_queues := _check_names('queues', claim_attempts.queues, 'queue');
    v_tasks := _check_names('tasks', claim_attempts.tasks, 'task');
    RETURN QUERY
    SELECT c.*
    FROM unnest(_claim(
        claim_attempts.worker, v_queues, v_tasks, claim_attempts.max_runs,
        _lease(claim_attempts.lease_seconds), claim_attempts.call_id
    )) AS c;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION claim_attempts(text, text[], integer, integer, uuid, text[]) IS
'Claims up to max_runs runnable runs (of the given tasks, if any; priority, then run_at; SKIP LOCKED), opening a leased attempt on each.';
