-- run_stats: runs by queue and status, with the age of the oldest runnable
-- run and how many are held behind a concurrency key. For dashboards and
-- `runrelay status`; it counts, so it costs O(runs).
--
-- The clock is the _clock view (_internal/now.sql), the one every function
-- reads. A view runs the functions it calls with its reader's privileges, and
-- the admin role that reads it may execute no internal helper (SPEC §5), so
-- the runnable rule (_runnable, _internal/runnable.sql) is spelled out here,
-- as in the claim indexes; tests/python/test_rule_homes.py proves the filters
-- agree with _runnable.
CREATE VIEW run_stats AS
SELECT
    r.queue,
    r.status,
    count(*) AS runs,
    count(*) FILTER (WHERE r.key_held) AS held_by_key,
    min(r.run_at) FILTER (WHERE r.status = 'queued' AND NOT r.key_held) AS oldest_run_at,
    extract(EPOCH FROM c.now - min(r.run_at) FILTER (
        WHERE r.status = 'queued' AND NOT r.key_held AND r.run_at <= c.now
    )) AS oldest_runnable_age_seconds
FROM runs AS r
CROSS JOIN _clock AS c
GROUP BY r.queue, r.status, c.now;

COMMENT ON VIEW run_stats IS
'Runs by queue and status: counts, held-by-key counts and the age of the oldest runnable run.';
