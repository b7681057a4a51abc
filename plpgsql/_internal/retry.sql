-- The retry policy of runs, in one place: which attempts count as failures,
-- how many a run may have, and how long it waits before the next attempt.
-- Changing the policy touches this file only: _fail (transitions.sql) applies
-- the decision, fail_ledger uses the same backoff curve for deliveries.

-- _backoff(): exponential backoff with jitter for the n-th failure:
-- base * 2^(n-1), capped, then scaled by a random factor in [0.5, 1).
CREATE FUNCTION _backoff(p_failures integer)
RETURNS interval
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_base double precision;
    v_max double precision;
BEGIN
    SELECT s.retry_base_seconds, s.retry_max_seconds INTO v_base, v_max FROM settings AS s;
    RETURN make_interval(secs => least(v_max, v_base * power(2, least(p_failures - 1, 30)))
        * (0.5 + random() * 0.5));
END;
$$;

COMMENT ON FUNCTION _backoff(integer) IS
'Retry delay after the n-th failure: exponential from settings.retry_base_seconds, capped, with jitter.';

-- _retry_decision(): what a failure of attempt p_attempt (failed, or lost to
-- the reaper) does to its run. Failed and lost attempts of the run's current
-- attempt series (numbered above runs.series_start: retry_run starts a new
-- series) count against max_attempts (released, resumed and cancelled ones
-- do not); this one counts too. With fewer failures than max_attempts the
-- run retries: outcome retry_scheduled, at p_retry_at when the worker named
-- a time, else after the backoff of this failure. Otherwise outcome failed
-- and run_at NULL.
-- Called under the custody locks: a VOLATILE read, so the count sees every
-- attempt committed before the locks were taken.
CREATE FUNCTION _retry_decision(
    p_run runs,
    p_attempt integer,
    p_retry_at timestamptz,
    p_now timestamptz,
    OUT outcome text,
    OUT run_at timestamptz
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_failures integer;
BEGIN
    SELECT count(*) + 1 INTO v_failures
    FROM attempts AS a
    WHERE
        a.run_id = p_run.run_id AND a.attempt > p_run.series_start
        AND a.status IN ('failed', 'lost') AND a.attempt <> p_attempt;
    IF v_failures < p_run.max_attempts THEN
        outcome := 'retry_scheduled';
        run_at := coalesce(p_retry_at, p_now + _backoff(v_failures));
    ELSE
        outcome := 'failed';
    END IF;
END;
$$;

COMMENT ON FUNCTION _retry_decision(runs, integer, timestamptz, timestamptz) IS
'Retry or fail after a failed or lost attempt: retry_scheduled with its run_at while the series'' failures < max_attempts, else failed.';
