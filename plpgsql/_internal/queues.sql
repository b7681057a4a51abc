-- The queues that have runs, found by skip scans: one index probe per queue,
-- the next queue name after the last one, whatever the number of runs in
-- each. Callers that read one index range per queue (list_runs, purge_runs,
-- and claims while a queue is paused) use these instead of a scan of the table, so
-- their cost grows with the number of queues, never with the number of
-- runs.

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

-- _unpaused_queues(): the queues a claim may take from while some queue is
-- paused (paused_queues, pause_queue). With a queue list, its queues that
-- are not paused, in its order; with none (every queue), each queue that
-- has queued runs not held by a key, but the paused ones: a skip scan of
-- runs_claim_queue_idx, whose leading column is the queue, one probe per
-- queue. The rule is _runnable's at any time (p_now infinity): the claim
-- itself applies its time condition, and a queue whose runs are all due
-- later costs one probe here, never a walk over them.
CREATE FUNCTION _unpaused_queues(p_queues text[])
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_queues text[];
BEGIN
    IF p_queues IS NOT NULL THEN
        RETURN ARRAY(
            SELECT q.name
            FROM unnest(p_queues) WITH ORDINALITY AS q (name, ord)
            WHERE NOT EXISTS (SELECT FROM paused_queues AS p WHERE p.queue = q.name)
            ORDER BY q.ord
        );
    END IF;
    WITH RECURSIVE q (name) AS (
        SELECT min(r.queue) FROM runs AS r
        WHERE _runnable(r.status, r.key_held, r.run_at, 'infinity'::timestamptz)
        UNION ALL
        SELECT (
            SELECT min(r.queue) FROM runs AS r
            WHERE _runnable(r.status, r.key_held, r.run_at, 'infinity'::timestamptz) AND r.queue > q.name
        )
        FROM q
        WHERE q.name IS NOT NULL
    )
    SELECT coalesce(array_agg(q.name), '{}') INTO v_queues
    FROM q
    WHERE q.name IS NOT NULL AND NOT EXISTS (SELECT FROM paused_queues AS p WHERE p.queue = q.name);
    RETURN v_queues;
END;
$$;

COMMENT ON FUNCTION _unpaused_queues(text[]) IS
'The queues a claim may take from while a queue is paused: p_queues without the paused ones, or every queue with runnable runs but those.';
