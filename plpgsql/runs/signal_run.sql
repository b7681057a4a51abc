-- signal_run(): deliver a named event to a run.
--
-- Locks: key, run row, attempt row, waiting under a function-local
-- lock_timeout (a busy run must not be mistaken for one that is not
-- waiting). Then, in fresh snapshots: the cancel marker, then the wait.
--   resumed   — the run waited for `name`: its attempt is resumed and the run
--               queued again with resume = {name, payload};
--   stored    — kept; the next suspend_attempt waiting for `name` consumes
--               it (oldest first). A wait whose timeout_at (or sleep) has
--               passed is over even if no claim has woken it yet: the run is
--               woken with its timeout resume and the signal is stored;
--   terminal  — the run has ended (or a pending cancellation ended it now);
--   not_found — no such run.
-- Not idempotent by itself: a repeated signal is stored again. Callers who
-- need exactly-once signals send them in their own transaction.
CREATE FUNCTION signal_run(
    run_id text,
    name text,
    payload jsonb DEFAULT '{}'
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '10s'
AS $$
DECLARE
    v_run runs;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', signal_run.run_id);
    PERFORM _check_id('name', signal_run.name);
    PERFORM _check_json('payload', signal_run.payload);

    v_run := _lock_run(signal_run.run_id);
    IF v_run.run_id IS NULL THEN
        RETURN 'not_found';
    END IF;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN 'terminal';
    END IF;
    PERFORM _lock_attempt(v_run.run_id, v_run.attempt_count);
    IF _apply_marker(v_run) THEN
        RETURN 'terminal';
    END IF;
    IF v_run.status = 'waiting' AND v_run.wake_at <= _now() THEN
        -- The wait already ended by time (a timeout, a due sleep) even if no
        -- claim has delivered that yet: the time wins, and the signal is
        -- kept for a later wait.
        PERFORM _wake(v_run, _timeout_resume(v_run));
    ELSIF v_run.status = 'waiting'
        AND v_run.wait ->> 'kind' = 'event'
        AND v_run.wait ->> 'name' = signal_run.name THEN
        PERFORM _wake(v_run, jsonb_build_object('name', signal_run.name, 'payload', signal_run.payload));
        RETURN 'resumed';
    END IF;
    INSERT INTO signals (run_id, name, payload, created_at)
    VALUES (signal_run.run_id, signal_run.name, signal_run.payload, _now());
    RETURN 'stored';
END;
$$;

COMMENT ON FUNCTION signal_run(text, text, jsonb) IS
'Sends a named event to a run: resumed (it waited for it), stored (for a later wait), terminal or not_found.';
