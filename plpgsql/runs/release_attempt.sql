-- release_attempt(): hand a live attempt back without consuming an attempt.
--
-- For a worker that shuts down with work in flight, or a handler that wants
-- to run again later without having failed (a snooze). The attempt ends
-- with status released and the run is queued again at run_at (now when
-- null), keeping its resume and its place at the head of its concurrency
-- key. A released attempt does not count against max_attempts: the failure
-- budget counts failed and lost attempts (_fail), never attempt numbers, so
-- a run may be released any number of times.
-- Locks: key, run row, attempt row (waiting under a bounded
-- lock_timeout); then, in fresh snapshots, the fence and the cancel marker.
-- Outcomes:
--   released   — the run is queued again; run.retry_scheduled is emitted
--                with {"attempt", "run_at", "released": true, "reason"};
--   cancelled  — a cancel marker won;
--   fence_lost — not the live current attempt, wrong token, the lease was
--                reaped, or the run waits (an attempt prepared for a waiting
--                failure or claimed for a detached terminal cannot hand the
--                run back: that would discard its wait).
-- An expired lease that was not reaped still passes the fence (SPEC §1).
-- Replays answer the recorded outcome and write nothing, whatever run_at and
-- reason they pass, as every fenced write does.
CREATE FUNCTION release_attempt(
    run_id text,
    attempt integer,
    lease_token uuid,
    run_at timestamptz DEFAULT NULL,
    reason text DEFAULT NULL
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
    v_now timestamptz;
    v_run_at timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', release_attempt.run_id);
    PERFORM _check_token(release_attempt.attempt, release_attempt.lease_token);
    PERFORM _check_time('run_at', release_attempt.run_at);
    PERFORM _check_reason('reason', release_attempt.reason);

    v_run := _lock_run(release_attempt.run_id);
    v_attempt := _lock_attempt(release_attempt.run_id, release_attempt.attempt);
    v_outcome := _fence(v_run, v_attempt, release_attempt.lease_token, 'release');
    IF v_outcome IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, v_outcome);
    END IF;
    IF v_run.status <> 'running' THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'fence_lost');
    END IF;
    IF _apply_marker(v_run, 'release', release_attempt.attempt) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'cancelled');
    END IF;

    v_now := _now();
    v_run_at := coalesce(release_attempt.run_at, v_now);
    UPDATE attempts AS a
    SET status = 'released',
        finished_at = v_now,
        outcome = 'released',
        outcome_op = 'release'
    WHERE a.run_id = release_attempt.run_id AND a.attempt = release_attempt.attempt;
    UPDATE runs AS r
    SET status = 'queued',
        run_at = v_run_at,
        updated_at = v_now,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = release_attempt.run_id
    RETURNING r.* INTO v_run;
    PERFORM _emit(release_attempt.run_id, 'run.retry_scheduled', jsonb_build_object(
        'attempt', release_attempt.attempt, 'run_at', v_run_at,
        'released', TRUE, 'reason', release_attempt.reason), FALSE, v_run.ledger_seq);
    IF _runnable(v_run.status, v_run.key_held, v_run.run_at, v_now) THEN
        PERFORM pg_notify(n.channel, v_run.queue) FROM _notifying('runs') AS n (channel);
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'released');
END;
$$;

COMMENT ON FUNCTION release_attempt(text, integer, uuid, timestamptz, text) IS
'Hands a live attempt back without consuming one of max_attempts: released, cancelled or fence_lost.';
