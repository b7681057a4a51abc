-- fail_attempt(): end a live attempt in failure; retry or fail the run.
--
-- Locks: key, run row, attempt row (waiting under a bounded
-- lock_timeout); then, in fresh snapshots, the fence and the cancel marker.
-- Outcomes:
--   retry_scheduled — fewer than max_attempts attempts have failed: the run
--                     is queued again at retry_at, or after exponential
--                     backoff with jitter;
--   failed          — attempts exhausted: the run is failed;
--   cancelled       — a cancel marker won;
--   fence_lost      — not the live current attempt, wrong token, or (with
--                     protect_waiting_suspension) the run no longer waits on
--                     the suspension this attempt recorded: it was woken or
--                     timed out, the wait is a detached runner's (whose
--                     pushed terminal a protected failure never overwrites),
--                     or the attempt's receipt is no longer that suspension;
--   superseded      — with preserve_runner_terminal: a detached runner pushed
--                     its terminal after the claim; it is authoritative and
--                     nothing is written.
-- With protect_waiting_suspension (after prepare_waiting_failure) the failure
-- applies only while the run still waits on the very same suspension
-- (_suspension_in_force, and before its wake_at), no cancel marker exists and
-- no newer attempt exists, all checked after the custody locks. final_events are appended before the run.retry_scheduled /
-- run.failed event. Replays answer the recorded outcome and write nothing.
CREATE FUNCTION fail_attempt(
    run_id text,
    attempt integer,
    lease_token uuid,
    error jsonb,
    retry_at timestamptz DEFAULT NULL,
    final_events jsonb DEFAULT '[]',
    preserve_runner_terminal boolean DEFAULT FALSE,
    protect_waiting_suspension boolean DEFAULT FALSE
)
RETURNS text
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
    v_run runs;
    v_attempt attempts;
    v_outcome text;
    v_events jsonb;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', fail_attempt.run_id);
    PERFORM _check_token(fail_attempt.attempt, fail_attempt.lease_token);
    PERFORM _check_json('error', fail_attempt.error);
    PERFORM _check_time('retry_at', fail_attempt.retry_at);
    v_events := _normalize_events('final_events', fail_attempt.final_events, FALSE);
    IF fail_attempt.preserve_runner_terminal IS NULL THEN
        PERFORM _invalid('preserve_runner_terminal', 'must not be null', 'Pass true or false.');
    END IF;
    IF fail_attempt.protect_waiting_suspension IS NULL THEN
        PERFORM _invalid('protect_waiting_suspension', 'must not be null', 'Pass true or false.');
    END IF;

    v_run := _lock_run(fail_attempt.run_id);
    v_attempt := _lock_attempt(fail_attempt.run_id, fail_attempt.attempt);
    v_outcome := _fence(v_run, v_attempt, fail_attempt.lease_token, 'fail');
    IF v_outcome IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, v_outcome);
    END IF;
    IF fail_attempt.protect_waiting_suspension THEN
        -- The suspension this attempt recorded must still be the one in force
        -- (never a detached runner's: a pushed terminal is not the worker's to
        -- overwrite), and past its wake_at it has ended even if not yet woken.
        IF NOT _suspension_in_force(v_run, v_attempt) OR v_run.wake_at <= _now() THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, 'fence_lost');
        END IF;
    END IF;
    IF _apply_marker(v_run, 'fail', fail_attempt.attempt) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'cancelled');
    END IF;
    IF fail_attempt.preserve_runner_terminal AND v_attempt.runner_result_received_at IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'superseded');
    END IF;
    IF jsonb_array_length(v_events) > 0 THEN
        PERFORM _check_keys_unused('final_events', v_events);
        PERFORM _append(fail_attempt.run_id, v_events);
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout, _fail(v_run, fail_attempt.attempt, 'failed', fail_attempt.error, fail_attempt.retry_at, 'fail'));
END;
$$;

COMMENT ON FUNCTION fail_attempt(text, integer, uuid, jsonb, timestamptz, jsonb, boolean, boolean) IS
'Fails a live attempt: retry_scheduled, failed, cancelled, fence_lost or superseded.';
