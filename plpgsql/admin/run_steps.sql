-- run_steps(): a run's recorded steps in the order they were recorded, each
-- with its result, the attempt that recorded it and when, a page at a time:
-- steps after position after_position, at most max_rows of them.
--
-- No row when the run does not exist or recorded no step. Reads only: one
-- range of steps_position_unique, no lock, no write.
CREATE TYPE run_step AS (
    step text,
    position integer,
    result jsonb,
    attempt integer,
    recorded_at timestamptz
);

CREATE FUNCTION run_steps(
    run_id text,
    after_position integer DEFAULT 0,
    max_rows integer DEFAULT 100
)
RETURNS SETOF run_step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', run_steps.run_id);
    PERFORM _check_int('after_position', run_steps.after_position, 0, 2147483647);
    PERFORM _check_int('max_rows', run_steps.max_rows, 1, 1000);
    RETURN QUERY
    SELECT s.step, s.position, s.result, s.attempt, s.recorded_at
    FROM steps AS s
    WHERE s.run_id = run_steps.run_id AND s.position > run_steps.after_position
    ORDER BY s.position
    LIMIT run_steps.max_rows;
END;
$$;

COMMENT ON FUNCTION run_steps(text, integer, integer) IS
'A run''s recorded steps in the order they were recorded, with their results and attempts, a page at a time.';
