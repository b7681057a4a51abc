-- wait_stats: waiting runs by queue and wait kind (sleep, event,
-- detached_runner), with the earliest moment one of them is due to wake (a
-- sleep's end or a wait's timeout; null when none has a deadline). For
-- dashboards and the metrics exporter. Like run_stats it counts, so it costs
-- O(runs) (at most a scan of runs_list_idx, whose second column is status).
CREATE VIEW wait_stats AS
SELECT
    r.queue,
    r.wait ->> 'kind' AS kind,
    count(*) AS runs,
    min(r.wake_at) AS next_wake_at
FROM runs AS r
WHERE r.status = 'waiting'
GROUP BY r.queue, r.wait ->> 'kind';

COMMENT ON VIEW wait_stats IS
'Waiting runs by queue and wait kind: counts and the earliest wake-up due.';
