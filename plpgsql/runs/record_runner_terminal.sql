-- record_runner_terminal(): a detached runner pushes its authoritative result.
--
-- No lease token: the runner is outside the worker's custody. Locks: key,
-- run row, attempt row. First write wins:
--   recorded  — stored on the attempt (runner_result, received_at), and
--               the run is announced on runrelay_runs so its owner can
--               claim_detached_terminal. The wait's deadline becomes the
--               claim window (_wake_at): 5 minutes from now, or timeout_at
--               if that is sooner. A terminal its owner never claims cannot
--               keep the run waiting: past the deadline the next claim on
--               the queue wakes the run, resume {"timed_out": true,
--               "runner_result": <the pushed result>};
--   duplicate — the same result was already recorded;
--   conflict  — a different result was already recorded (kept);
--   too_late  — the wait already ended (its timeout_at has passed, woken or
--               not, or the run moved on or was cancelled); nothing changes;
--   not_found — no such attempt, or it never waited on a detached runner.
CREATE FUNCTION record_runner_terminal(
    run_id text,
    attempt integer,
    result jsonb
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
    v_now timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', record_runner_terminal.run_id);
    PERFORM _check_int('attempt', record_runner_terminal.attempt, 1, 2147483647);
    PERFORM _check_json('result', record_runner_terminal.result);

    v_run := _lock_run(record_runner_terminal.run_id);
    v_attempt := _lock_attempt(record_runner_terminal.run_id, record_runner_terminal.attempt);
    IF v_run.run_id IS NULL OR v_attempt.run_id IS NULL
        OR NOT _wait_detached(v_attempt.wait) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_found');
    END IF;
    IF v_attempt.runner_result_received_at IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, CASE WHEN v_attempt.runner_result = record_runner_terminal.result THEN 'duplicate' ELSE 'conflict' END);
    END IF;
    v_now := _now();
    -- Past timeout_at the wait has ended even if no claim has woken it yet:
    -- the timeout is authoritative, and the next claim delivers it.
    IF v_attempt.status <> 'waiting' OR v_run.status <> 'waiting'
        OR v_attempt.attempt <> v_run.attempt_count
        OR v_run.wake_at <= v_now THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'too_late');
    END IF;
    UPDATE attempts AS a
    SET runner_result = record_runner_terminal.result, runner_result_received_at = v_now
    WHERE a.run_id = record_runner_terminal.run_id AND a.attempt = record_runner_terminal.attempt;
    UPDATE runs AS r
    SET wake_at = _wake_at(r.wait, v_now), updated_at = v_now
    WHERE r.run_id = record_runner_terminal.run_id;
    PERFORM pg_notify(n.channel, v_run.queue) FROM _notifying('runs') AS n (channel);
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'recorded');
END;
$$;

COMMENT ON FUNCTION record_runner_terminal(text, integer, jsonb) IS
'A detached runner pushes its terminal result (first write wins): recorded, duplicate, conflict, too_late or not_found.';
