-- cancel_run(): cancel a run; never lost, never waits for custody locks.
--
-- 1. Writes the cancel marker (first reason wins) without waiting for any
--    custody lock (the marker table has no foreign key to runs).
-- 2. Tries the custody locks without waiting (key try-lock, run row and
--    attempt rows SKIP LOCKED):
--      cancelled        — locks taken and the run still live: the run and its
--                         live attempts are cancelled, run.cancelled emitted,
--                         runrelay_terminal notified;
--      cancel_requested — a writer holds a lock; every writer re-checks the
--                         marker after taking the locks and applies it, and
--                         reap_expired sweeps markers nobody applied;
--      already_terminal — the run had ended (its marker is not kept);
--      not_found        — no such run.
-- Repeating a cancel is safe: the run is cancelled once. Without call_id a
-- repeat answers what the run's state says now (already_terminal once
-- applied). With call_id (a uuid the client picks for the call), a repeat of
-- a call that answered cancelled or cancel_requested answers that again and
-- writes nothing, even after the marker was applied or dropped
-- (_internal/calls.sql); a repeat with another reason raises 22023. The
-- call_id's lock comes first: only a call with the same id, still running,
-- holds it, and a repeat waits for that call's outcome. already_terminal and
-- not_found changed nothing and leave no record: a repeat is decided afresh.
CREATE FUNCTION cancel_run(
    run_id text,
    reason text DEFAULT NULL,
    call_id uuid DEFAULT NULL
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
    v_status text;
    v_run runs;
    v_digest bytea;
    v_recorded text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', cancel_run.run_id);
    PERFORM _check_reason('reason', cancel_run.reason);
    PERFORM _check_call_id(cancel_run.call_id);

    IF cancel_run.call_id IS NOT NULL THEN
        v_digest := _call_digest(jsonb_build_array(cancel_run.reason));
        v_recorded := _recorded_call(cancel_run.call_id, 'cancel_run', cancel_run.run_id, v_digest);
        IF v_recorded IS NOT NULL THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, v_recorded);
        END IF;
    END IF;

    SELECT r.status INTO v_status FROM runs AS r WHERE r.run_id = cancel_run.run_id;
    IF v_status IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_found');
    END IF;
    IF _terminal(v_status) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'already_terminal');
    END IF;
    INSERT INTO cancellations (run_id, reason, requested_at)
    VALUES (cancel_run.run_id, cancel_run.reason, _now())
    ON CONFLICT ON CONSTRAINT cancellations_pkey DO NOTHING;

    v_run := _try_lock_run(cancel_run.run_id);
    IF v_run.run_id IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, _record_call(cancel_run.call_id, 'cancel_run', cancel_run.run_id, v_digest, 'cancel_requested'));
    END IF;
    IF _terminal(v_run.status) THEN
        DELETE FROM cancellations AS c WHERE c.run_id = cancel_run.run_id;
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'already_terminal');
    END IF;
    -- Attempt rows are only ever locked by a holder of the run row, which we
    -- now are: this cannot wait.
    PERFORM 1 FROM attempts AS a
    WHERE a.run_id = cancel_run.run_id AND a.status IN ('running', 'waiting')
    ORDER BY a.attempt
    FOR NO KEY UPDATE;
    PERFORM _apply_marker(v_run);
    RETURN _restore_lock_wait(v_caller_lock_timeout, _record_call(cancel_run.call_id, 'cancel_run', cancel_run.run_id, v_digest, 'cancelled'));
END;
$$;

COMMENT ON FUNCTION cancel_run(text, text, uuid) IS
'Cancels a run without waiting for its custody locks: cancelled, cancel_requested, already_terminal or not_found; '
'a repeated call_id gets the first answer.';
