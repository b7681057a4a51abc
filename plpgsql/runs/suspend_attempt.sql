-- suspend_attempt(): the live attempt ends by waiting; the run waits.
--
-- wait: {"kind":"sleep","until":ts} | {"kind":"event","name":n,"timeout_at":ts?}
--     | {"kind":"detached_runner","runner":r,"timeout_at":ts?}.
-- Locks: key, run row, attempt row; then fence and cancel marker in fresh
-- snapshots. Outcomes: waiting; resumed (an event wait whose signal was
-- already stored: it is consumed and the run is queued at once with
-- resume = {name, payload}); cancelled; fence_lost. The attempt keeps
-- runner_result = {"status":"suspended","wait":...} as its receipt. A
-- detached_runner wait's run.waiting is transport-only. Replays answer the
-- recorded outcome.
CREATE FUNCTION suspend_attempt(
    run_id text,
    attempt integer,
    lease_token uuid,
    wait jsonb,
    final_events jsonb DEFAULT '[]'
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
    v_wait jsonb;
    v_wake_at timestamptz;
    v_now timestamptz;
    v_signal signals;
    v_resume jsonb;
    v_signal_name text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', suspend_attempt.run_id);
    PERFORM _check_token(suspend_attempt.attempt, suspend_attempt.lease_token);
    v_wait := _normalize_wait(suspend_attempt.wait);
    v_events := _normalize_events('final_events', suspend_attempt.final_events, FALSE);

    v_run := _lock_run(suspend_attempt.run_id);
    v_attempt := _lock_attempt(suspend_attempt.run_id, suspend_attempt.attempt);
    v_outcome := _fence(v_run, v_attempt, suspend_attempt.lease_token, 'suspend');
    IF v_outcome IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, v_outcome);
    END IF;
    IF v_run.status <> 'running' THEN
        -- A prepared or claimed-for-terminal attempt of a waiting run cannot suspend again.
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'fence_lost');
    END IF;
    IF _apply_marker(v_run, 'suspend', suspend_attempt.attempt) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'cancelled');
    END IF;

    v_now := _now();
    IF jsonb_array_length(v_events) > 0 THEN
        PERFORM _check_keys_unused('final_events', v_events);
        PERFORM _append(suspend_attempt.run_id, v_events);
    END IF;
    v_wake_at := _wake_at(v_wait);
    UPDATE attempts AS a
    SET status = 'waiting',
        wait = v_wait,
        runner_result = jsonb_build_object('status', 'suspended', 'wait', v_wait),
        outcome = 'waiting',
        outcome_op = 'suspend'
    WHERE a.run_id = suspend_attempt.run_id AND a.attempt = suspend_attempt.attempt;
    UPDATE runs AS r
    SET status = 'waiting', wait = v_wait, wake_at = v_wake_at, resume = NULL, updated_at = v_now,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = suspend_attempt.run_id
    RETURNING r.* INTO v_run;
    PERFORM _emit(suspend_attempt.run_id, 'run.waiting',
        jsonb_build_object('attempt', suspend_attempt.attempt, 'wait', v_wait),
        _wait_detached(v_wait), v_run.ledger_seq);

    -- A wait a signal resumes consumes a signal stored for it, oldest first.
    v_signal_name := _wait_signal_name(v_wait);
    IF v_signal_name IS NOT NULL THEN
        SELECT s.* INTO v_signal
        FROM signals AS s
        WHERE s.run_id = suspend_attempt.run_id AND s.name = v_signal_name
        ORDER BY s.signal_id
        LIMIT 1
        FOR UPDATE;
        IF v_signal.signal_id IS NOT NULL THEN
            DELETE FROM signals AS s WHERE s.signal_id = v_signal.signal_id;
            v_resume := jsonb_build_object('name', v_signal.name, 'payload', v_signal.payload);
            PERFORM _end_wait(v_run, v_resume);
            UPDATE attempts AS a
            SET outcome = 'resumed'
            WHERE a.run_id = suspend_attempt.run_id AND a.attempt = suspend_attempt.attempt;
            RETURN _restore_lock_wait(v_caller_lock_timeout, 'resumed');
        END IF;
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'waiting');
END;
$$;

COMMENT ON FUNCTION suspend_attempt(text, integer, uuid, jsonb, jsonb) IS
'Suspends a live attempt on a typed wait (sleep, event, detached_runner): waiting, resumed, cancelled or fence_lost.';
