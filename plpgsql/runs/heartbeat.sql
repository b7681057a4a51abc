-- heartbeat(): extend a live attempt's lease.
--
-- Locks: the run's custody locks (key, run row, attempt row), waiting under a
-- bounded lock_timeout. Then, in fresh snapshots: the fence, then the
-- cancel marker. Outcomes: ok (lease extended to now + lease_seconds, clamped
-- to 5..300), cancelled (the run was cancelled — stop; this and every later
-- write for the attempt answer cancelled), fence_lost. An expired lease that
-- was not reaped still passes the fence. Replays are harmless.
CREATE TYPE heartbeat_result AS (
    outcome text,
    lease_expires_at timestamptz
);

CREATE FUNCTION heartbeat(
    run_id text,
    attempt integer,
    lease_token uuid,
    lease_seconds integer DEFAULT 30
)
RETURNS SETOF heartbeat_result
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
    v_beat timestamptz;
    v_expires timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', heartbeat.run_id);
    PERFORM _check_token(heartbeat.attempt, heartbeat.lease_token);

    v_run := _lock_run(heartbeat.run_id);
    v_attempt := _lock_attempt(heartbeat.run_id, heartbeat.attempt);
    v_outcome := _fence(v_run, v_attempt, heartbeat.lease_token, 'heartbeat');
    IF v_outcome IS NOT NULL THEN
        RETURN QUERY SELECT v_outcome, NULL::timestamptz;
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;
    IF _apply_marker(v_run) THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::timestamptz;
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;
    -- The beat lands when the locks are held: one that waited for the run
    -- lock keeps its full lease.
    v_beat := _clock_now();
    v_expires := v_beat + _lease(heartbeat.lease_seconds);
    UPDATE attempts AS a
    SET heartbeat_at = v_beat, lease_expires_at = v_expires
    WHERE a.run_id = heartbeat.run_id AND a.attempt = heartbeat.attempt;
    RETURN QUERY SELECT 'ok'::text, v_expires;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION heartbeat(text, integer, uuid, integer) IS
'Extends a live attempt''s lease: ok, cancelled (stop work) or fence_lost.';
