-- _try_lock_run(): the custody locks of one run without waiting: the key's
-- row by _try_lock_key, then the run row SKIP LOCKED. NULL when any of them
-- is busy (or the run does not exist). Used by the reaper and cancel_run.
-- A run's key lock taken by try is released only at commit, as usual.
CREATE FUNCTION _try_lock_run(p_run_id text)
RETURNS runs
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text;
    v_run runs;
BEGIN
    SELECT r.concurrency_key INTO v_key FROM runs AS r WHERE r.run_id = p_run_id;
    IF v_key IS NOT NULL AND NOT _try_lock_key(v_key) THEN
        RETURN NULL;
    END IF;
    SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_id FOR NO KEY UPDATE SKIP LOCKED;
    IF v_run.run_id IS NULL THEN
        RETURN NULL;
    END IF;
    -- Fresh read of the row now that it is held (the locking read may have
    -- followed an update chain, but the rest of the function wants a snapshot
    -- that also shows everything committed before the lock was granted).
    SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_id;
    RETURN v_run;
END;
$$;

COMMENT ON FUNCTION _try_lock_run(text) IS
'Takes a run''s custody locks without waiting (key try-lock, row SKIP LOCKED); NULL when busy.';
