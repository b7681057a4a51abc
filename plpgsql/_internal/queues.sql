-- The queues that have runs, found by skip scans: one index probe per queue,
-- the next queue name after the last one, whatever the number of runs in
-- each. Callers that read one index range per queue (list_runs, purge_runs,
-- and claims while a queue is paused) use these instead of a scan of the
-- table, so their cost grows with the number of queues, never with the
-- number of runs.

-- _listed_queues(): the queues of runs_list_idx (every run that is not
-- running), in the index's order.
CREATE FUNCTION _listed_queues()
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_queues text[];
BEGIN
    -- min() over the partial index's predicate is answered by one probe of
    -- runs_list_idx, whose leading column is the queue.
    WITH RECURSIVE q (name) AS (
        SELECT min(r.queue) FROM runs AS r WHERE r.status <> 'running'
        UNION ALL
        SELECT (
            SELECT min(r.queue) FROM runs AS r
            WHERE r.status <> 'running' AND r.queue > q.name
        )
        FROM q
        WHERE q.name IS NOT NULL
    )
    SELECT coalesce(array_agg(q.name), '{}') INTO v_queues FROM q WHERE q.name IS NOT NULL;
    RETURN v_queues;
END;
$$;

COMMENT ON FUNCTION _listed_queues() IS
'The queues of every run that is not running, one probe of runs_list_idx per queue.';
