-- signal_run(): deliver a named event to a run.
--
-- Locks: the call_id's lock (with a call_id), then key, run row, attempt
-- row, waiting under a function-local lock_timeout (a busy run must not be
-- mistaken for one that is not waiting). Then, in fresh snapshots: the
-- cancel marker, then the wait.
--   resumed   — the run waited for `name`: its attempt is resumed and the run
--               queued again with resume = {name, payload};
--   stored    — kept; the next suspend_attempt waiting for `name` consumes
--               it (oldest first). A wait whose timeout_at (or sleep) has
--               passed is over even if no claim has woken it yet: the run is
--               woken with its timeout resume and the signal is stored;
--   terminal  — the run has ended (or a pending cancellation ended it now);
--   not_found — no such run.
-- Replay: with call_id (a uuid the client picks for the call), a repeat of a
-- call that changed something (resumed, stored, or terminal because it
-- applied a pending cancellation) answers what it recorded and writes
-- nothing, whatever happened to the run since (_internal/calls.sql); a repeat
-- with other arguments raises 22023. A repeat while the first call still
-- runs waits for it. A call that changed nothing leaves no record: its repeat
-- is decided afresh. Without call_id a repeated signal is stored again.
CREATE FUNCTION signal_run(
    run_id text,
    name text,
    payload jsonb DEFAULT '{}',
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
    v_run runs;
    v_digest bytea;
    v_recorded text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', signal_run.run_id);
    PERFORM _check_id('name', signal_run.name);
    PERFORM _check_json('payload', signal_run.payload);
    PERFORM _check_call_id(signal_run.call_id);

    IF signal_run.call_id IS NOT NULL THEN
        v_digest := _call_digest(jsonb_build_array(signal_run.name, signal_run.payload));
        v_recorded := _recorded_call(signal_run.call_id, 'signal_run', signal_run.run_id, v_digest);
        IF v_recorded IS NOT NULL THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, v_recorded);
        END IF;
    END IF;

    v_run := _lock_run(signal_run.run_id);
    IF v_run.run_id IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_found');
    END IF;
    IF _terminal(v_run.status) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'terminal');
    END IF;
    PERFORM _lock_attempt(v_run.run_id, v_run.attempt_count);
    IF _apply_marker(v_run) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, _record_call(signal_run.call_id, 'signal_run', signal_run.run_id, v_digest, 'terminal'));
    END IF;
    IF v_run.status = 'waiting' AND v_run.wake_at <= _now() THEN
        -- The wait already ended by time (a timeout, a due sleep) even if no
        -- claim has delivered that yet: the time wins, and the signal is
        -- kept for a later wait.
        PERFORM _end_wait(v_run, _timeout_resume(v_run));
    ELSIF v_run.status = 'waiting'
        AND _wait_signal_name(v_run.wait) = signal_run.name THEN
        PERFORM _end_wait(v_run, jsonb_build_object('name', signal_run.name, 'payload', signal_run.payload));
        RETURN _restore_lock_wait(v_caller_lock_timeout, _record_call(signal_run.call_id, 'signal_run', signal_run.run_id, v_digest, 'resumed'));
    END IF;
    INSERT INTO signals (run_id, name, payload, created_at)
    VALUES (signal_run.run_id, signal_run.name, signal_run.payload, _now());
    RETURN _restore_lock_wait(v_caller_lock_timeout, _record_call(signal_run.call_id, 'signal_run', signal_run.run_id, v_digest, 'stored'));
END;
$$;

COMMENT ON FUNCTION signal_run(text, text, jsonb, uuid) IS
'Sends a named event to a run: resumed (it waited for it), stored (for a later wait), terminal or not_found; '
'a repeated call_id gets the first answer.';
