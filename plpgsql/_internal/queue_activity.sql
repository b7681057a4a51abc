-- Queue activity (plpgsql/schema/11_queue_activity.sql): the runs of each
-- queue that ended completed or failed, per minute. record_queue_activity
-- finalizes minutes into queue_activity with _queue_activity_between;
-- queue_overview reads the finalized minutes from the table and counts the
-- minutes after the watermark with the same helper, so a minute reads the
-- same whichever way it is counted.

-- _activity_minute(): the minute an instant falls in, the start of a whole
-- minute in absolute time: date_bin, not date_trunc, whose minutes follow the
-- session's TimeZone (a zone whose offset is not whole minutes, as some
-- historical ones are, would cut them elsewhere). A SQL-standard body,
-- IMMUTABLE, no SET clause, as _runnable: the planner inlines it, so it
-- costs nothing per event counted. The queue_activity CHECKs spell it out
-- (a table constraint cannot depend on a function the migrations drop).
CREATE FUNCTION _activity_minute(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
RETURN date_bin('1 minute', p_at, timestamptz '2000-01-01 00:00:00+00');

COMMENT ON FUNCTION _activity_minute(timestamptz) IS
'The whole minute an instant falls in, in absolute time (inlined by the planner).';

-- _queue_activity_between(): the runs that ended completed or failed with
-- their terminal event created in [p_from, p_to), by minute and queue, one
-- row per (minute, queue) with activity, as queue_activity holds them.
--
-- The source is the lifecycle ledger: run.completed and run.failed, which
-- the engine emits once per run end (a run retried with retry_run and ended
-- again is counted again). Events are found by their creation time in
-- ledger_created_idx (created_at, event_id), one range, so the count costs
-- the range's events (both lanes, every type) and one primary-key probe of
-- runs per terminal event for its queue, never the ledger's history. The
-- probe is LATERAL ... LIMIT 1: joined flat, a plan made without statistics
-- may hash every run. created_at is the writer's clock (_now()), read before
-- its transaction commits; a caller that wants a minute final waits until
-- no transaction that could still commit an event of it is likely to be
-- open (record_queue_activity's grace period).
--
-- Events appended by a producer under the engine's names (append_events
-- accepts any type) are counted too. A run deleted by purge_runs takes its
-- events with it: it is counted only while they are there.
CREATE FUNCTION _queue_activity_between(p_from timestamptz, p_to timestamptz)
RETURNS SETOF queue_activity
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT
        _activity_minute(e.created_at) AS minute,
        r.queue,
        (count(*) FILTER (WHERE e.type = 'run.completed'))::integer AS completed,
        (count(*) FILTER (WHERE e.type = 'run.failed'))::integer AS failed
    FROM ledger_events AS e
    CROSS JOIN LATERAL (
        SELECT x.queue FROM runs AS x WHERE x.run_id = e.run_id LIMIT 1
    ) AS r
    WHERE
        e.created_at >= p_from AND e.created_at < p_to
        AND e.lane = 'lifecycle' AND e.type IN ('run.completed', 'run.failed')
    GROUP BY _activity_minute(e.created_at), r.queue;
END;
$$;

COMMENT ON FUNCTION _queue_activity_between(timestamptz, timestamptz) IS
'Runs that ended completed or failed with their terminal event created in [p_from, p_to), by minute and queue.';
