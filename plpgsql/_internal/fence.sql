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
-- The rule itself is _fence_of, over the columns it reads, written as a
-- SQL-standard body so that the planner inlines it into a statement that
-- decides many items at once (_complete) as if the CASE were spelled out;
-- _fence applies it to a run row and an attempt row (NULL rows when they do
-- not exist), for the functions that hold one of each. IMMUTABLE: it reads
-- only its arguments (see _runnable for why that matters to the planner).
CREATE FUNCTION _fence_of(
    p_run_id text,
    p_run_attempt_count integer,
    p_attempt integer,
    p_attempt_token uuid,
    p_attempt_status text,
    p_attempt_outcome_op text,
    p_attempt_outcome text,
    p_lease_token uuid,
    p_op text
)
RETURNS text
LANGUAGE sql
IMMUTABLE
RETURN CASE
    WHEN
        p_run_id IS NULL OR p_attempt IS NULL
        OR p_attempt_token IS DISTINCT FROM p_lease_token
        THEN 'fence_lost'
    WHEN p_attempt_status = 'cancelled' THEN 'cancelled'
    WHEN p_attempt_outcome_op = p_op THEN p_attempt_outcome
    WHEN p_attempt <> p_run_attempt_count OR p_attempt_status <> 'running' THEN 'fence_lost'
END;

COMMENT ON FUNCTION _fence_of(text, integer, integer, uuid, text, text, text, uuid, text) IS
'The write fence over the columns it reads (inlined by the planner): NULL to proceed, else the outcome to answer.';

CREATE FUNCTION _fence(p_run runs, p_attempt attempts, p_lease_token uuid, p_op text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN _fence_of(
        p_run.run_id, p_run.attempt_count, p_attempt.attempt, p_attempt.lease_token,
        p_attempt.status, p_attempt.outcome_op, p_attempt.outcome, p_lease_token, p_op
    );
END;
$$;

COMMENT ON FUNCTION _fence(runs, attempts, uuid, text) IS
'The write fence: NULL to proceed, else fence_lost, cancelled, or the outcome an earlier identical call recorded.';
