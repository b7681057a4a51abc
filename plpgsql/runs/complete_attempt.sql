-- complete_attempt(): finish an attempt successfully; the run is completed.
--
-- A one-item use of _complete, the one completion routine (complete.sql).
-- Locks: key, then run row (waiting under a bounded lock_timeout); then the
-- fence and the cancel marker in a fresh snapshot. A run without a key needs
-- no key lock, and _complete takes it without a look at the key.
-- Outcomes: completed, cancelled (a cancel marker won), fence_lost.
-- final_events are appended before run.completed in the same transaction.
-- Replay: repeated with the same attempt and token after it committed, the
-- call answers what it answered then and writes nothing.
CREATE FUNCTION complete_attempt(
    run_id text,
    attempt integer,
    lease_token uuid,
    result jsonb DEFAULT '{}',
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
    v_events jsonb;
    v_outcomes text[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', complete_attempt.run_id);
    PERFORM _check_token(complete_attempt.attempt, complete_attempt.lease_token);
    PERFORM _check_json('result', complete_attempt.result);
    v_events := _normalize_events('final_events', complete_attempt.final_events, FALSE);
    -- A run without a key is completed without a look at its key; for one
    -- with a key, _complete locked and wrote nothing, and the key lock comes
    -- first (custody step 1).
    v_outcomes := _complete(
        ARRAY[complete_attempt.run_id], ARRAY[complete_attempt.attempt], ARRAY[complete_attempt.lease_token],
        ARRAY[complete_attempt.result], ARRAY[v_events], FALSE);
    IF v_outcomes IS NULL THEN
        PERFORM _lock_key_of(complete_attempt.run_id);
        v_outcomes := _complete(
            ARRAY[complete_attempt.run_id], ARRAY[complete_attempt.attempt], ARRAY[complete_attempt.lease_token],
            ARRAY[complete_attempt.result], ARRAY[v_events]);
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout, v_outcomes[1]);
END;
$$;

COMMENT ON FUNCTION complete_attempt(text, integer, uuid, jsonb, jsonb) IS
'Completes a run from its live attempt: completed, cancelled (a cancel marker won) or fence_lost.';
