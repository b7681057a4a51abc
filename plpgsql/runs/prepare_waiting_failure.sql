-- prepare_waiting_failure(): the first half of failing a run that waits.
--
-- Takes the custody locks first (key, run row, attempt row), then decides in
-- a fresh snapshot:
--   not_applicable — the run is not waiting, or waits on a detached runner;
--   prepared       — this attempt's receipt is the very wait the run is in
--                    (_suspension_in_force), the token matches, no newer
--                    attempt exists and no cancel marker exists: the attempt
--                    is set back to running (with a fresh 30 s lease,
--                    counted from when the locks are held) so
--                    fail_attempt(..., protect_waiting_suspension => true)
--                    can write;
--   fence_lost     — otherwise.
-- Preparing never clears the wait and never emits run.resumed: a signal or a
-- timeout that arrives before the failure still wins, and the protected
-- failure then answers fence_lost. Replaying a committed prepare answers
-- prepared again and writes nothing (the lease it granted is not extended:
-- heartbeat does that).
CREATE FUNCTION prepare_waiting_failure(
    run_id text,
    attempt integer,
    lease_token uuid
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
    v_granted timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', prepare_waiting_failure.run_id);
    PERFORM _check_token(prepare_waiting_failure.attempt, prepare_waiting_failure.lease_token);

    v_run := _lock_run(prepare_waiting_failure.run_id);
    v_attempt := _lock_attempt(prepare_waiting_failure.run_id, prepare_waiting_failure.attempt);
    IF v_run.run_id IS NULL OR v_run.status <> 'waiting' OR _wait_detached(v_run.wait) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_applicable');
    END IF;
    IF v_attempt.run_id IS NULL
        OR v_attempt.lease_token IS DISTINCT FROM prepare_waiting_failure.lease_token
        OR v_attempt.status NOT IN ('waiting', 'running')
        OR NOT _suspension_in_force(v_run, v_attempt)
        OR (_cancel_reason(v_run.run_id)).requested THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'fence_lost');
    END IF;
    IF v_attempt.status = 'running' THEN
        -- Already prepared (a replay after a lost reply): the same answer,
        -- and nothing written — not even a fresher lease.
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'prepared');
    END IF;
    -- The lease is granted when the locks are held: a prepare that waited for
    -- the run lock still hands over a full 30 s.
    v_granted := _clock_now();
    UPDATE attempts AS a
    SET status = 'running', heartbeat_at = v_granted, lease_expires_at = v_granted + _lease(30)
    WHERE a.run_id = prepare_waiting_failure.run_id AND a.attempt = prepare_waiting_failure.attempt;
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'prepared');
END;
$$;

COMMENT ON FUNCTION prepare_waiting_failure(text, integer, uuid) IS
'Prepares a waiting run''s attempt for a protected failure: prepared, fence_lost or not_applicable.';
