-- reap_expired(): end leases that expired, and apply stranded cancellations.
--
-- Up to max_attempts expired running attempts, oldest expiry first. Each run
-- is taken SKIP LOCKED (its key with a try-lock), so the reaper never waits
-- for a live writer and never deadlocks; what it skips, the next call
-- retries. On the locked rows it re-checks, in a fresh snapshot, that the
-- attempt is still the live current one and still expired. Then:
--   cancelled        — a cancel marker exists: it is applied;
--   waiting          — the attempt had been prepared for a waiting failure or
--                      claimed for a detached terminal: it goes back to
--                      waiting and the run keeps waiting, with its deadline
--                      (_wake_at) restored — a claimed detached terminal's
--                      claim window, which the claim had disarmed, so a
--                      lapsed owner cannot leave the run waiting forever;
--   retry_scheduled / failed — the attempt becomes lost and the run retries
--                      or fails by the same rules as fail_attempt.
-- Also applies up to max_attempts cancel markers that no writer has applied
-- yet (cancel_run answered cancel_requested and the lock holder finished
-- without seeing the marker), reported as outcome cancelled (attempt NULL
-- for a run that never started).
CREATE TYPE reap_expired_result AS (
    run_id text,
    attempt integer,
    outcome text
);

CREATE FUNCTION reap_expired(max_attempts integer DEFAULT 100)
RETURNS SETOF reap_expired_result
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
    v_now timestamptz;
    v_candidate record;
    v_run runs;
    v_attempt attempts;
    v_error jsonb;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_int('max_attempts', reap_expired.max_attempts, 1, 10000);
    v_now := _now();

    FOR v_candidate IN
        SELECT a.run_id, a.attempt
        FROM attempts AS a
        WHERE a.status = 'running' AND a.lease_expires_at < v_now
        ORDER BY a.lease_expires_at
        LIMIT reap_expired.max_attempts
    LOOP
        v_run := _try_lock_run(v_candidate.run_id);
        CONTINUE WHEN v_run.run_id IS NULL;
        SELECT a.* INTO v_attempt
        FROM attempts AS a
        WHERE a.run_id = v_candidate.run_id AND a.attempt = v_candidate.attempt
        FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN v_attempt.run_id IS NULL
            OR v_attempt.status <> 'running'
            OR v_attempt.lease_expires_at >= v_now
            OR v_attempt.attempt <> v_run.attempt_count;
        IF _apply_marker(v_run) THEN
            RETURN NEXT (v_candidate.run_id, v_candidate.attempt, 'cancelled')::reap_expired_result;
        ELSIF v_run.status = 'waiting' THEN
            UPDATE attempts AS a
            SET status = 'waiting'
            WHERE a.run_id = v_candidate.run_id AND a.attempt = v_candidate.attempt;
            UPDATE runs AS r
            SET wake_at = _wake_at(r.wait, v_attempt.runner_result_received_at)
            WHERE r.run_id = v_candidate.run_id
                AND r.wake_at IS DISTINCT FROM _wake_at(r.wait, v_attempt.runner_result_received_at);
            RETURN NEXT (v_candidate.run_id, v_candidate.attempt, 'waiting')::reap_expired_result;
        ELSE
            v_error := jsonb_build_object(
                'reason', 'lease_expired',
                'worker', v_attempt.worker,
                'lease_expires_at', v_attempt.lease_expires_at);
            RETURN NEXT (
                v_candidate.run_id,
                v_candidate.attempt,
                _fail(v_run, v_candidate.attempt, 'lost', v_error, NULL, 'reap')
            )::reap_expired_result;
        END IF;
    END LOOP;

    FOR v_candidate IN
        SELECT c.run_id
        FROM cancellations AS c
        ORDER BY c.requested_at
        LIMIT reap_expired.max_attempts
    LOOP
        v_run := _try_lock_run(v_candidate.run_id);
        CONTINUE WHEN v_run.run_id IS NULL;
        IF _terminal(v_run.status) THEN
            DELETE FROM cancellations AS c WHERE c.run_id = v_candidate.run_id;
            CONTINUE;
        END IF;
        PERFORM 1 FROM attempts AS a WHERE a.run_id = v_run.run_id FOR NO KEY UPDATE SKIP LOCKED;
        IF _apply_marker(v_run) THEN
            RETURN NEXT (v_run.run_id, nullif(v_run.attempt_count, 0), 'cancelled')::reap_expired_result;
        END IF;
    END LOOP;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION reap_expired(integer) IS
'Ends expired leases (attempt lost; run retries or fails) and applies stranded cancel markers, SKIP LOCKED.';
