-- _fence(): the fence every fenced write applies after taking the custody
-- locks. Returns NULL when the write may proceed, otherwise the outcome to
-- answer:
--   * fence_lost  — no such attempt, wrong token, not the run's current
--                   attempt, or no longer live;
--   * cancelled   — the attempt was cancelled (every later write says so);
--   * the outcome recorded by an earlier call of the same operation with the
--     same attempt and token (an exact replay after a lost reply).
-- A wrong token answers fence_lost whatever the attempt's state, so a caller
-- without the token learns nothing about the attempt.
CREATE FUNCTION _fence(p_run runs, p_attempt attempts, p_lease_token uuid, p_op text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_run.run_id IS NULL OR p_attempt.run_id IS NULL
        OR p_attempt.lease_token IS DISTINCT FROM p_lease_token THEN
        RETURN 'fence_lost';
    END IF;
    IF p_attempt.status = 'cancelled' THEN
        RETURN 'cancelled';
    END IF;
    IF p_attempt.outcome_op = p_op THEN
        RETURN p_attempt.outcome;
    END IF;
    IF p_attempt.attempt <> p_run.attempt_count OR p_attempt.status <> 'running' THEN
        RETURN 'fence_lost';
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _fence(runs, attempts, uuid, text) IS
'The write fence: NULL to proceed, else fence_lost, cancelled, or the outcome an earlier identical call recorded.';
