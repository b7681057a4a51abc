-- run_attempts(): a run's attempts in attempt order, each with its worker,
-- status, lease, the outcome its ending write answered, its error and the
-- wait it suspended on, a page at a time: attempts after after_attempt, at
-- most max_rows of them. The lease token is not shown: it is the worker's
-- credential for its fenced writes.
--
-- No row when the run does not exist or has no attempt (yet). Reads only:
-- one range of the attempts primary key, no lock, no write.
CREATE TYPE run_attempt AS (
    attempt integer,
    worker text,
    status text,
    claimed_at timestamptz,
    heartbeat_at timestamptz,
    lease_expires_at timestamptz,
    finished_at timestamptz,
    outcome text,
    error jsonb,
    wait jsonb,
    runner_result jsonb,
    runner_result_received_at timestamptz
);

CREATE FUNCTION run_attempts(
    run_id text,
    after_attempt integer DEFAULT 0,
    max_rows integer DEFAULT 100
)
RETURNS SETOF run_attempt
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', run_attempts.run_id);
    PERFORM _check_int('after_attempt', run_attempts.after_attempt, 0, 2147483647);
    PERFORM _check_int('max_rows', run_attempts.max_rows, 1, 1000);
    RETURN QUERY
    SELECT
        a.attempt, a.worker, a.status, a.claimed_at, a.heartbeat_at, a.lease_expires_at,
        a.finished_at, a.outcome, a.error, a.wait, a.runner_result, a.runner_result_received_at
    FROM attempts AS a
    WHERE a.run_id = run_attempts.run_id AND a.attempt > run_attempts.after_attempt
    ORDER BY a.attempt
    LIMIT run_attempts.max_rows;
END;
$$;

COMMENT ON FUNCTION run_attempts(text, integer, integer) IS
'A run''s attempts in attempt order with their workers, leases, outcomes and errors, a page at a time.';
