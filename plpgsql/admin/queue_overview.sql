-- queue_overview(): one row per queue, what a dashboard's overview shows:
-- its backlog by state, how long its oldest runnable run has waited, and
-- its runs that ended completed or failed in the last hour, minute by
-- minute. The queues: every queue that has runs (a skip scan of
-- runs_list_idx, _listed_queues, and the queues of the running runs), and
-- every paused queue, runs or not; by name.
--
--   queue, paused                   the name; whether pause_queue holds it
--   queued                          queued, due now and not held behind its
--                                   concurrency key: what a claim may take
--   scheduled                       queued, not held, due later (run_at in
--                                   the future: a retry's backoff, a run_at)
--   held_by_key                     queued behind an earlier live run of its
--                                   concurrency key (due or not)
--   running, waiting                runs in those states
--   oldest_runnable_age_seconds     now - the oldest run_at among the
--                                   queued ones (null when none)
--   completed_per_minute,           runs that ended so, per minute: 60
--   failed_per_minute               entries, oldest first; the last is the
--                                   current minute, still counting
--   completed_last_hour,            the sums of those: the current minute
--   failed_last_hour                and the 59 before it
-- queued + scheduled + held_by_key is every queued run of the queue.
--
-- The minutes: those before the rollup's watermark come from queue_activity
-- (record_queue_activity finalizes them); the rest, from the watermark up to
-- now (normally the grace period and a maintenance interval: a few
-- minutes), are counted from the lifecycle ledger by the same helper
-- (_queue_activity_between). Without a watermark, or with one older than
-- the hour, the whole hour is counted from the ledger: the figures are the
-- same, only dearer. A minute counted from the ledger counts the terminal
-- events still there: a prune or purge_runs whose cut-off is within the
-- last minutes removes some of them (the rollup keeps what it counted).
--
-- Cost: index ranges of the live backlog and the hour, never the history
-- of ended runs or delivered events. Per queue: its runs_claim_queue_idx
-- range (queued and scheduled, with the oldest run_at), its runs_list_idx
-- ranges (queue, 'queued') and (queue, 'waiting'), index-only where the
-- visibility map allows; the running runs through their running attempts
-- (attempts_lease_expiry_idx, a primary-key probe of each run): O(runs in
-- flight); queue_activity's primary-key range for the hour (at most 60 rows
-- per queue); the ledger_created_idx range after the watermark with a probe
-- of runs per terminal event. The queue list is one probe of runs_list_idx
-- per queue.
--
-- Reads only: no lock, no write. The queue list and the watermark are read
-- first, then the rest in one statement, whose counts of runs share one
-- snapshot; the ledger's tail is counted by the helper a moment later, in a
-- snapshot of its own. The rollup's minutes and the tail's are disjoint
-- (split at the watermark read), so no run is counted twice whatever
-- record_queue_activity commits meanwhile; a queue whose first run is
-- enqueued after the list was read shows from the next call.
CREATE TYPE queue_overview_row AS (
    queue text,
    paused boolean,
    queued bigint,
    scheduled bigint,
    held_by_key bigint,
    running bigint,
    waiting bigint,
    oldest_runnable_age_seconds double precision,
    completed_last_hour bigint,
    failed_last_hour bigint,
    completed_per_minute integer [],
    failed_per_minute integer []
);

CREATE FUNCTION queue_overview()
RETURNS SETOF queue_overview_row
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- A generic plan cannot know how many queues there are, and its guess can
-- cross jit_above_cost: compiling the statement would cost far more than
-- running it (list_runs has the same setting).
SET jit = off
-- The counts have no LIMIT: planned without statistics (a young install),
-- each queue's count guessed at half the table read it all, once per queue,
-- rather than its index range. An index range is never dearer than the
-- scan it replaces here; _complete has the same setting.
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := _now();
    -- The 60 minutes: [v_first, v_end), the last one the current minute.
    v_end timestamptz := _activity_minute(v_now) + interval '1 minute';
    v_first timestamptz := v_end - interval '60 minutes';
    v_final timestamptz;
    v_queues text[];
BEGIN
    PERFORM _require_read_committed();
    v_queues := _listed_queues();
    SELECT w.final_before INTO v_final FROM queue_activity_watermark AS w;
    -- The rollup's part of the hour, [v_first, v_final); the ledger's, the rest.
    v_final := least(greatest(v_final, v_first), v_end);

    RETURN QUERY
    WITH running AS (
        -- Running runs through their running attempts, each run by a
        -- primary-key probe (LIMIT keeps it a probe, as in list_runs).
        SELECT r.queue, count(DISTINCT a.run_id) AS runs
        FROM attempts AS a
        CROSS JOIN LATERAL (
            SELECT x.queue, x.status FROM runs AS x WHERE x.run_id = a.run_id LIMIT 1
        ) AS r
        WHERE a.status = 'running' AND r.status = 'running'
        GROUP BY r.queue
    ),
    queues AS (
        SELECT q.name FROM unnest(v_queues) AS q (name)
        UNION
        SELECT p.queue FROM paused_queues AS p
        UNION
        SELECT r.queue FROM running AS r
    ),
    activity AS (
        SELECT a.minute, a.queue, a.completed, a.failed
        FROM queue_activity AS a
        WHERE a.minute >= v_first AND a.minute < v_final
        UNION ALL
        SELECT t.minute, t.queue, t.completed, t.failed
        FROM _queue_activity_between(v_final, v_end) AS t
    ),
    minutes AS (
        SELECT
            a.queue,
            (extract(EPOCH FROM a.minute - v_first) / 60)::integer AS i,
            sum(a.completed)::integer AS completed,
            sum(a.failed)::integer AS failed
        FROM activity AS a
        GROUP BY a.queue, a.minute
    ),
    -- Per queue, its minutes with activity (indexes 0 .. 59) and their
    -- counts, spread over the 60 entries below: no join of every queue's
    -- 60 minutes with every minute counted.
    active AS (
        SELECT
            m.queue,
            array_agg(m.i) AS minutes,
            array_agg(m.completed) AS completed,
            array_agg(m.failed) AS failed,
            sum(m.completed) AS completed_total,
            sum(m.failed) AS failed_total
        FROM minutes AS m
        GROUP BY m.queue
    )
    SELECT
        q.name,
        EXISTS (SELECT FROM paused_queues AS p WHERE p.queue = q.name),
        c.due,
        c.later,
        l.queued - c.due - c.later,
        coalesce(rn.runs, 0),
        w.waiting,
        extract(EPOCH FROM v_now - c.oldest)::double precision,
        coalesce(s.completed_total, 0)::bigint,
        coalesce(s.failed_total, 0)::bigint,
        ARRAY(
            SELECT coalesce(s.completed[array_position(s.minutes, g.i)], 0)
            FROM generate_series(0, 59) AS g (i)
            ORDER BY g.i
        ),
        ARRAY(
            SELECT coalesce(s.failed[array_position(s.minutes, g.i)], 0)
            FROM generate_series(0, 59) AS g (i)
            ORDER BY g.i
        )
    FROM queues AS q
    -- The claim index's range of the queue: every queued run not held by
    -- its key (_runnable at any time), due or not.
    CROSS JOIN LATERAL (
        SELECT
            count(*) FILTER (WHERE r.run_at <= v_now) AS due,
            count(*) FILTER (WHERE r.run_at > v_now) AS later,
            min(r.run_at) FILTER (WHERE r.run_at <= v_now) AS oldest
        FROM runs AS r
        WHERE r.queue = q.name AND _runnable(r.status, r.key_held, r.run_at, 'infinity'::timestamptz)
    ) AS c
    -- Every queued run of the queue, held or not: its runs_list_idx range.
    CROSS JOIN LATERAL (
        SELECT count(*) AS queued
        FROM runs AS r
        WHERE r.queue = q.name AND r.status = 'queued' AND r.status <> 'running'
    ) AS l
    CROSS JOIN LATERAL (
        SELECT count(*) AS waiting
        FROM runs AS r
        WHERE r.queue = q.name AND r.status = 'waiting' AND r.status <> 'running'
    ) AS w
    LEFT JOIN running AS rn ON q.name = rn.queue
    LEFT JOIN active AS s ON q.name = s.queue
    ORDER BY q.name;
END;
$$;

COMMENT ON FUNCTION queue_overview() IS
'Each queue''s backlog by state, its oldest runnable age, and its runs ended completed or failed in the last hour, per minute.';
