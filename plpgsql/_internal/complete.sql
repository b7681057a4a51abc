-- _complete(): the decision behind complete_attempt and complete_attempts.
-- Precondition: the caller validated the input and holds the run's key lock;
-- this takes the run row and attempt row locks.
CREATE FUNCTION _complete(
    p_run_id text, p_attempt integer, p_lease_token uuid, p_result jsonb, p_events jsonb
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_run runs;
    v_attempt attempts;
    v_outcome text;
    v_now timestamptz := _now();
    v_seq bigint;
BEGIN
    SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_id FOR NO KEY UPDATE;
    v_attempt := _lock_attempt(p_run_id, p_attempt);
    v_outcome := _fence(v_run, v_attempt, p_lease_token, 'complete');
    IF v_outcome IS NOT NULL THEN
        RETURN v_outcome;
    END IF;
    IF _apply_marker(v_run, 'complete', p_attempt) THEN
        RETURN 'cancelled';
    END IF;
    IF jsonb_array_length(p_events) > 0 THEN
        PERFORM _check_keys_unused('final_events', p_events);
        PERFORM _append(p_run_id, p_events);
    END IF;
    UPDATE attempts AS a
    SET status = 'completed', finished_at = v_now, outcome = 'completed', outcome_op = 'complete'
    WHERE a.run_id = p_run_id AND a.attempt = p_attempt;
    UPDATE runs AS r
    SET status = 'completed',
        result = p_result,
        wait = NULL,
        wake_at = NULL,
        finished_at = v_now,
        updated_at = v_now,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = p_run_id
    RETURNING r.ledger_seq INTO v_seq;
    PERFORM _emit(p_run_id, 'run.completed',
        jsonb_build_object('attempt', p_attempt, 'result', p_result), FALSE, v_seq);
    PERFORM _ended(p_run_id, 'completed', v_run.concurrency_key);
    RETURN 'completed';
END;
$$;

COMMENT ON FUNCTION _complete(text, integer, uuid, jsonb, jsonb) IS
'Fences and completes one attempt (caller holds the key lock and validated the input).';
