-- read_runner_terminal(): the terminal a detached runner pushed, if any.
--
-- One row (result, received_at) for an existing attempt — both null until
-- record_runner_terminal recorded a result (the suspension receipt is not a
-- terminal); no row when the attempt does not exist. Reads without locks.
CREATE TYPE runner_terminal AS (
    result jsonb,
    received_at timestamptz
);

CREATE FUNCTION read_runner_terminal(
    run_id text,
    attempt integer
)
RETURNS SETOF runner_terminal
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', read_runner_terminal.run_id);
    PERFORM _check_int('attempt', read_runner_terminal.attempt, 1, 2147483647);
    RETURN QUERY
    SELECT
        CASE WHEN a.runner_result_received_at IS NOT NULL THEN a.runner_result END,
        a.runner_result_received_at
    FROM attempts AS a
    WHERE a.run_id = read_runner_terminal.run_id AND a.attempt = read_runner_terminal.attempt;
END;
$$;

COMMENT ON FUNCTION read_runner_terminal(text, integer) IS
'Returns the terminal result a detached runner pushed for an attempt, and when it arrived.';
