-- The lock-wait bound of every writing function.
--
-- A function that waits for a lock waits at most 10 s, or less when the
-- caller's own lock_timeout is shorter: a caller's tighter budget is always
-- honoured (55P03, nothing written, no lock kept). One bound for every
-- function: 10 s is long enough that a live peer's short transaction (a
-- claim, an ack) always finishes first, and short enough that a call queued
-- behind a stuck session fails where its caller can see it.
--
-- Why not a SET lock_timeout clause: a function's SET clause replaces the
-- caller's value, so a caller's 200 ms became 10 s. Instead each function
-- opens with
--
--     v_caller_lock_timeout text := _bound_lock_wait();
--
-- which tightens lock_timeout for the rest of the transaction only when the
-- caller's is looser (0 means none), and hands every result back through
-- _restore_lock_wait(v_caller_lock_timeout, ...), which puts the caller's
-- value back after the result has been computed. A setting made inside a
-- function outlives it unless the variable is in the function's own SET
-- clause, so the restore is explicit; an error needs none (the failed
-- transaction or savepoint rolls the setting back with everything else).

CREATE FUNCTION _bound_lock_wait()
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller text := current_setting('lock_timeout');
BEGIN
    -- set_config in an IF, not a PERFORM: every writing call runs this, and
    -- a PERFORM is a statement of its own (executor start, a snapshot) where
    -- an IF's condition is evaluated as a plain expression. set_config
    -- answers the value it set, never null.
    IF v_caller = '0' OR v_caller::interval > interval '10 seconds' THEN
        IF set_config('lock_timeout', '10s', TRUE) IS NULL THEN
            RAISE EXCEPTION 'runrelay: lock_timeout was not set';
        END IF;
    END IF;
    RETURN v_caller;
END;
$$;

COMMENT ON FUNCTION _bound_lock_wait() IS
'Bounds lock waits at 10 s unless the caller''s lock_timeout is tighter; returns the caller''s value.';

CREATE FUNCTION _restore_lock_wait(p_caller text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- An IF, not a PERFORM, as in _bound_lock_wait.
    IF current_setting('lock_timeout') <> p_caller THEN
        IF set_config('lock_timeout', p_caller, TRUE) IS NULL THEN
            RAISE EXCEPTION 'runrelay: lock_timeout was not restored';
        END IF;
    END IF;
END;
$$;

COMMENT ON FUNCTION _restore_lock_wait(text) IS
'Puts back the caller''s lock_timeout that _bound_lock_wait returned.';

-- The same, passing a function's result through, so that
-- RETURN _restore_lock_wait(v_caller_lock_timeout, <expression>) computes the
-- result (and takes its locks) under the bound before restoring.
CREATE FUNCTION _restore_lock_wait(p_caller text, p_result anycompatible)
RETURNS anycompatible
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _restore_lock_wait(p_caller);
    RETURN p_result;
END;
$$;

COMMENT ON FUNCTION _restore_lock_wait(text, anycompatible) IS
'Puts back the caller''s lock_timeout and returns p_result unchanged.';
