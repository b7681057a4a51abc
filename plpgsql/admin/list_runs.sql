-- list_runs(): find runs by queue, status, concurrency key and age, newest
-- first, a page at a time.
--
-- Order: created_at descending, then run_id descending (the database's
-- collation). A page holds at most max_rows runs; the next page starts after
-- its last row: pass that row's created_at and run_id as after_created_at and
-- after_run_id (keyset pagination: a run created or ended meanwhile neither
-- shifts nor repeats the rows of later pages). Filters, each optional:
--   queue, status, concurrency_key  equal to;
--   created_after, created_before   created_at > / < the bound;
--   finished_before                 finished_at < the bound (ended runs only).
--
-- Cost: index ranges only, never a scan of runs. Each (queue, status) pair
-- that can match is one range of runs_list_idx, read newest first up to
-- max_rows rows (the queues come from a skip scan, _listed_queues, unless
-- queue is given), and the ranges are merged; with concurrency_key, one
-- range of runs_key_list_idx, read until max_rows rows match. Running runs
-- are not in those indexes (a claim writes no entry there): they are read
-- through their running attempts, O(runs in flight), or, with
-- concurrency_key, from the key's live runs (runs_key_live_idx). So a page costs
-- O(queues x statuses x max_rows) entries, independent of the number of
-- runs; with concurrency_key it costs the key's runs newer than the page
-- that fail the other filters, and with finished_before the runs created
-- before the bound that ended after it (the runs live at that moment).
--
-- Reads only: no lock, no write. Each call reads one snapshot, so a page is
-- consistent in itself; pages read at different moments need not be.
CREATE TYPE run_summary AS (
    run_id text,
    queue text,
    status text,
    priority integer,
    concurrency_key text,
    key_held boolean,
    run_at timestamptz,
    attempt_count integer,
    max_attempts integer,
    wait jsonb,
    error jsonb,
    created_at timestamptz,
    updated_at timestamptz,
    finished_at timestamptz
);

CREATE FUNCTION list_runs(
    queue text DEFAULT NULL,
    status text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    created_after timestamptz DEFAULT NULL,
    created_before timestamptz DEFAULT NULL,
    finished_before timestamptz DEFAULT NULL,
    after_created_at timestamptz DEFAULT NULL,
    after_run_id text DEFAULT NULL,
    max_rows integer DEFAULT 100
)
RETURNS SETOF run_summary
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- The planner cannot know how many (queue, status) pairs a page reads (an
-- array's length is unknown to a generic plan), and its guess can cross
-- jit_above_cost: compiling the page's query would cost a hundred times
-- more than running it.
SET jit = off
AS $$
DECLARE
    -- The page's upper bound, exclusive, on (created_at, run_id): the
    -- cursor, created_before or finished_before, whichever is tightest.
    -- ('', the least text, makes a bound on created_at alone.)
    v_upper_at timestamptz := 'infinity'::timestamptz;
    v_upper_id text := '';
    v_lower_at timestamptz;
    v_queues text[];
    v_statuses text[];
    v_running boolean;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('queue', list_runs.queue, TRUE);
    PERFORM _check_status('status', list_runs.status);
    PERFORM _check_id('concurrency_key', list_runs.concurrency_key, TRUE);
    PERFORM _check_time('created_after', list_runs.created_after);
    PERFORM _check_time('created_before', list_runs.created_before);
    PERFORM _check_time('finished_before', list_runs.finished_before);
    PERFORM _check_time('after_created_at', list_runs.after_created_at);
    PERFORM _check_id('after_run_id', list_runs.after_run_id, TRUE);
    IF (list_runs.after_created_at IS NULL) <> (list_runs.after_run_id IS NULL) THEN
        PERFORM _invalid(
            CASE WHEN list_runs.after_created_at IS NULL THEN 'after_created_at' ELSE 'after_run_id' END,
            CASE
                WHEN list_runs.after_created_at IS NULL THEN 'must be given together with after_run_id'
                ELSE 'must be given together with after_created_at'
            END,
            'Pass both after_created_at and after_run_id (the last row of the previous page), or neither.');
    END IF;
    PERFORM _check_int('max_rows', list_runs.max_rows, 1, 1000);

    IF list_runs.after_created_at IS NOT NULL THEN
        v_upper_at := list_runs.after_created_at;
        v_upper_id := list_runs.after_run_id;
    END IF;
    IF (list_runs.created_before, '') < (v_upper_at, v_upper_id) THEN
        v_upper_at := list_runs.created_before;
        v_upper_id := '';
    END IF;
    -- A run ends after it is created: one that ended before the bound was
    -- created before it, so the bound also bounds created_at.
    IF (list_runs.finished_before, '') < (v_upper_at, v_upper_id) THEN
        v_upper_at := list_runs.finished_before;
        v_upper_id := '';
    END IF;
    v_lower_at := coalesce(list_runs.created_after, '-infinity');

    v_statuses := CASE
        WHEN list_runs.status IS NULL THEN ARRAY['queued', 'waiting', 'completed', 'failed', 'cancelled']
        WHEN list_runs.status = 'running' THEN '{}'::text[]
        ELSE ARRAY[list_runs.status]
    END;
    IF list_runs.finished_before IS NOT NULL THEN
        -- Only ended runs have finished_at; the others' ranges are not read.
        v_statuses := ARRAY(
            SELECT s.status FROM unnest(v_statuses) AS s (status)
            WHERE _terminal(s.status)
        );
    END IF;
    v_running := list_runs.finished_before IS NULL AND coalesce(list_runs.status, 'running') = 'running';

    -- Two steps: the page's keys from index entries alone (index-only
    -- scans where the visibility map allows), then its rows, one
    -- primary-key probe each: a page reads max_rows rows, not one per
    -- entry looked at. Both in one statement, so in one snapshot.
    IF list_runs.concurrency_key IS NOT NULL THEN
        RETURN QUERY
        SELECT
            r.run_id, r.queue, r.status, r.priority, r.concurrency_key, r.key_held, r.run_at,
            r.attempt_count, r.max_attempts, r.wait, r.error, r.created_at, r.updated_at, r.finished_at
        FROM (
            SELECT k.created_at, k.run_id
            FROM (
                (
                    SELECT r.created_at, r.run_id
                    FROM runs AS r
                    WHERE
                        r.concurrency_key = list_runs.concurrency_key
                        AND r.status <> 'running'
                        AND (r.created_at, r.run_id) < (v_upper_at, v_upper_id)
                        AND r.created_at > v_lower_at
                        AND r.status = ANY(v_statuses)
                        AND (list_runs.queue IS NULL OR r.queue = list_runs.queue)
                        AND (list_runs.finished_before IS NULL OR r.finished_at < list_runs.finished_before)
                    ORDER BY r.created_at DESC, r.run_id DESC
                    LIMIT list_runs.max_rows
                )
                UNION ALL
                -- The key's running runs: a range of runs_key_live_idx (the
                -- key's live runs), whose predicate status = 'running' implies.
                SELECT r.created_at, r.run_id
                FROM runs AS r
                WHERE
                    v_running
                    AND r.concurrency_key = list_runs.concurrency_key
                    AND r.status = 'running'
                    AND (r.created_at, r.run_id) < (v_upper_at, v_upper_id)
                    AND r.created_at > v_lower_at
                    AND (list_runs.queue IS NULL OR r.queue = list_runs.queue)
            ) AS k
            ORDER BY k.created_at DESC, k.run_id DESC
            LIMIT list_runs.max_rows
        ) AS page
        CROSS JOIN LATERAL (SELECT r.* FROM runs AS r WHERE r.run_id = page.run_id LIMIT 1) AS r
        ORDER BY page.created_at DESC, page.run_id DESC;
        RETURN;
    END IF;

    IF cardinality(v_statuses) > 0 THEN
        v_queues := CASE
            WHEN list_runs.queue IS NOT NULL THEN ARRAY[list_runs.queue]
            ELSE _listed_queues()
        END;
    END IF;
    RETURN QUERY
    SELECT
        r.run_id, r.queue, r.status, r.priority, r.concurrency_key, r.key_held, r.run_at,
        r.attempt_count, r.max_attempts, r.wait, r.error, r.created_at, r.updated_at, r.finished_at
    FROM (
        SELECT k.created_at, k.run_id
        FROM (
            SELECT p.created_at, p.run_id
            FROM generate_subscripts(v_queues, 1) AS q (i)
            CROSS JOIN generate_subscripts(v_statuses, 1) AS s (i)
            -- One range of runs_list_idx per pair, newest first.
            CROSS JOIN LATERAL (
                SELECT r.created_at, r.run_id
                FROM runs AS r
                WHERE
                    r.queue = v_queues[q.i]
                    AND r.status = v_statuses[s.i]
                    AND r.status <> 'running'
                    AND (r.created_at, r.run_id) < (v_upper_at, v_upper_id)
                    AND r.created_at > v_lower_at
                    AND (list_runs.finished_before IS NULL OR r.finished_at < list_runs.finished_before)
                ORDER BY r.created_at DESC, r.run_id DESC
                LIMIT list_runs.max_rows
            ) AS p
            UNION ALL
            -- Running runs through their running attempts
            -- (attempts_lease_expiry_idx), each run by a primary-key probe:
            -- LIMIT keeps it a probe (joined flat, a plan made without
            -- statistics read every run for status = 'running').
            SELECT r.created_at, r.run_id
            FROM attempts AS a
            CROSS JOIN LATERAL (
                SELECT x.created_at, x.run_id, x.status, x.queue
                FROM runs AS x WHERE x.run_id = a.run_id LIMIT 1
            ) AS r
            WHERE
                v_running
                AND a.status = 'running'
                AND r.status = 'running'
                AND (r.created_at, r.run_id) < (v_upper_at, v_upper_id)
                AND r.created_at > v_lower_at
                AND (list_runs.queue IS NULL OR r.queue = list_runs.queue)
        ) AS k
        ORDER BY k.created_at DESC, k.run_id DESC
        LIMIT list_runs.max_rows
    ) AS page
    CROSS JOIN LATERAL (SELECT r.* FROM runs AS r WHERE r.run_id = page.run_id LIMIT 1) AS r
    ORDER BY page.created_at DESC, page.run_id DESC;
END;
$$;

COMMENT ON FUNCTION list_runs(
    text, text, text, timestamptz, timestamptz, timestamptz, timestamptz, text, integer
) IS
'Lists runs newest first, filtered by queue, status, concurrency key and age, a page of at most max_rows at a time.';
