-- _claim_candidates(): lock up to p_limit runnable runs, best first, without
-- waiting. With a queue list, each queue's best are read from its own range
-- of runs_claim_queue_idx and merged, so the cost is O(queues x limit)
-- whatever the backlog (a single `queue = ANY(...)` scan would have to sort
-- every runnable run of those queues). The rows are locked FOR UPDATE SKIP
-- LOCKED; a few more than p_limit may be locked until commit when several
-- queues are given.
--
-- With a task list (p_tasks), only runs of those tasks: each (queue, task)
-- pair's best are read from its own range of runs_claim_task_idx and merged,
-- O(queues x tasks x limit), however many runs of other tasks (or untyped
-- runs) wait in the same queues. Without a queue list, the queues holding
-- runnable runs of each task are found first by a skip scan of the same
-- index (one probe per such queue), then read as pairs.
--
-- enable_sort is off for these statements: the claim indexes give the best
-- first without a sort, and any plan that sorts reads every runnable run it
-- could order. With statistics taken while a queue held no queued run (an
-- install analysed between bursts), a queued run looks rare, and the
-- generic plan read a queue's whole backlog through runs_list_idx (queue,
-- status) and sorted it (PostgreSQL 18: 0.58 ms for a claim of one at 2 000
-- queued, growing with the backlog, against 0.017 ms by the claim index).
-- The merge of several queues' or pairs' candidates still sorts: it has no
-- other plan, and it sorts at most p_limit rows per range.
CREATE FUNCTION _claim_candidates(p_queues text[], p_tasks text[], p_limit integer, p_now timestamptz)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
AS $$
DECLARE
    v_pairs text[][];
BEGIN
    IF p_tasks IS NOT NULL THEN
        IF p_queues IS NOT NULL THEN
            v_pairs := ARRAY(
                SELECT ARRAY[q.name, t.name]
                FROM unnest(p_queues) AS q (name) CROSS JOIN unnest(p_tasks) AS t (name)
            );
        ELSE
            v_pairs := ARRAY(
                WITH RECURSIVE found (task, queue) AS (
                    SELECT t.name, (
                        SELECT r.queue FROM runs AS r
                        WHERE r.task = t.name AND r.status = 'queued' AND NOT r.key_held
                        ORDER BY r.task, r.queue
                        LIMIT 1
                    )
                    FROM unnest(p_tasks) AS t (name)
                    UNION ALL
                    SELECT f.task, (
                        SELECT r.queue FROM runs AS r
                        WHERE r.task = f.task AND r.queue > f.queue AND r.status = 'queued' AND NOT r.key_held
                        ORDER BY r.task, r.queue
                        LIMIT 1
                    )
                    FROM found AS f
                    WHERE f.queue IS NOT NULL
                )
                SELECT ARRAY[f.queue, f.task] FROM found AS f WHERE f.queue IS NOT NULL
            );
        END IF;
        IF cardinality(v_pairs) = 0 THEN
            RETURN '{}'::text[];
        END IF;
        RETURN ARRAY(
            SELECT c.run_id
            FROM generate_subscripts(v_pairs, 1) AS p (i)
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.priority, r.run_at
                FROM runs AS r
                WHERE
                    r.task = v_pairs[p.i][2]
                    AND r.queue = v_pairs[p.i][1]
                    AND _runnable(r.status, r.key_held, r.run_at, p_now)
                ORDER BY r.priority DESC, r.run_at
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            ORDER BY c.priority DESC, c.run_at
            LIMIT p_limit
        );
    ELSIF p_queues IS NULL THEN
        RETURN ARRAY(
            SELECT r.run_id
            FROM runs AS r
            WHERE _runnable(r.status, r.key_held, r.run_at, p_now)
            ORDER BY r.priority DESC, r.run_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        );
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN ARRAY(
            SELECT r.run_id
            FROM runs AS r
            WHERE
                r.queue = p_queues[1]
                AND _runnable(r.status, r.key_held, r.run_at, p_now)
            ORDER BY r.priority DESC, r.run_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        );
    ELSE
        RETURN ARRAY(
            SELECT c.run_id
            FROM unnest(p_queues) AS q (name)
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.priority, r.run_at
                FROM runs AS r
                WHERE
                    r.queue = q.name
                    AND _runnable(r.status, r.key_held, r.run_at, p_now)
                ORDER BY r.priority DESC, r.run_at
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            ORDER BY c.priority DESC, c.run_at
            LIMIT p_limit
        );
    END IF;
END;
$$;

COMMENT ON FUNCTION _claim_candidates(text[], text[], integer, timestamptz) IS
'Locks up to p_limit runnable runs (of the given tasks, if any), best first, SKIP LOCKED, by index ranges per queue.';

-- _end_due_waits(): wake up to p_limit waits whose time has come (a due sleep, or
-- an event/detached_runner wait past its timeout), SKIP LOCKED. Runs with a
-- cancel marker are cancelled instead, when their key lock is free.
--
-- Planned per call (plan_cache_mode auto, where its callers force generic
-- plans): the queue list folded into the plan picks runs_wake_idx's range of
-- each queue; a generic plan would walk runs_wake_any_idx and filter out
-- every other queue's due waits. A claim calls it only when some wait is
-- due, so the planning is paid then and not on every claim.
CREATE FUNCTION _end_due_waits(p_queues text[], p_limit integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = auto
AS $$
DECLARE
    v_now timestamptz := _now();
    v_run runs;
    v_run_id text;
    v_woken integer := 0;
BEGIN
    -- The oldest due first; then woken in the lock order of runs
    -- (custody.sql), like every path that writes several runs.
    FOR v_run_id IN
        SELECT d.run_id
        FROM (
            SELECT w.run_id
            FROM runs AS w
            WHERE
                w.wake_at <= v_now
                AND (p_queues IS NULL OR w.queue = ANY(p_queues))
            ORDER BY w.wake_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) AS d
        ORDER BY d.run_id COLLATE "C"
    LOOP
        SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = v_run_id;
        -- Re-checked on the locked row: a signal or a runner terminal may have won.
        IF v_run.status <> 'waiting' OR v_run.wake_at IS NULL OR v_run.wake_at > v_now THEN
            CONTINUE;
        END IF;
        IF (_cancel_reason(v_run.run_id)).requested THEN
            IF v_run.concurrency_key IS NULL
                OR _try_lock_key(v_run.concurrency_key) THEN
                PERFORM _apply_marker(v_run);
            END IF;
            CONTINUE;
        END IF;
        PERFORM _end_wait(v_run, _timeout_resume(v_run));
        v_woken := v_woken + 1;
    END LOOP;
    RETURN v_woken;
END;
$$;

COMMENT ON FUNCTION _end_due_waits(text[], integer) IS
'Wakes up to p_limit due sleeps and timed-out waits (SKIP LOCKED); applies pending cancel markers.';
