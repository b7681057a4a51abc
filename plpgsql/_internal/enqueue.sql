-- _enqueue(): the one enqueue decision, for one run (enqueue_run) or many
-- (enqueue_runs), set-based: a fixed number of statements whatever the
-- number of items.
--
-- Element i of the arrays is item i, validated by _check_enqueue, run_at
-- already defaulted. Each item is decided as enqueue_run decides it, and the
-- items in array order as sequential enqueue_run calls would decide them:
--   * a run_id that names an existing run: the same queue, task and payload
--     answer the run (its status, created = false); another queue, task or
--     payload raises 22023 (_enqueue_conflict) and the whole call changes
--     nothing;
--   * a run_id repeated in the array: its first item decides; a later item
--     is its replay (created = false), or 22023 if its queue, task or
--     payload differs from the first's;
--   * every other item creates its run, emitting run.queued at seq 1, with
--     its trace context (already checked; null for none).
-- Concurrency keys: the new runs of a key take increasing key positions in
-- array order; the first one is the key's head (not key_held) when the key
-- has no live run, every later one is held.
--
-- Locks: the row locks of the new runs' keys, ascending by key
-- (custody step 1, _lock_concurrency_keys), before the key's live runs are
-- read; no row lock, the rows are new. The rows are inserted in run_id
-- COLLATE "C" order, so two calls that insert the same run_ids wait for each
-- other in one order and never deadlock; an insert that meets a concurrent
-- insert of the same run_id waits for it (ON CONFLICT), and if that one
-- commits the item is decided as a repeat of it. Lanes as every appender
-- takes them (_emit_lifecycle), never waiting. Notifies runrelay_runs once
-- per queue that got a runnable run.
CREATE FUNCTION _enqueue(
    p_run_ids text[],
    p_queues text[],
    p_payloads jsonb[],
    p_run_ats timestamptz[],
    p_priorities integer[],
    p_max_attempts integer[],
    p_payload_retentions text[],
    p_keys text[],
    p_trace_contexts jsonb[],
    p_tasks text[],
    p_batch boolean
)
RETURNS SETOF enqueue_runs_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    -- Per item: the status of the run its run_id named when looked up (NULL:
    -- none), the index of the first item with its run_id, and whether it is
    -- the first new run of its concurrency key in this call.
    v_found text[];
    v_first integer[];
    v_key_first boolean[];
    v_conflict integer;
    v_lock_keys text[];
    v_new integer;
    v_created text[];
    v_events jsonb[];
    v_wake text[];
    v_lost integer;
    v_run runs;
BEGIN
    -- One primary-key probe per item (LATERAL ... LIMIT 1; see claim_attempts).
    SELECT
        array_agg(x.status ORDER BY x.i),
        array_agg(x.first_i ORDER BY x.i),
        array_agg(x.key_first ORDER BY x.i),
        min(x.i) FILTER (WHERE x.conflict),
        array_agg(DISTINCT p_keys[x.i]) FILTER (WHERE x.is_new AND p_keys[x.i] IS NOT NULL),
        count(*) FILTER (WHERE x.is_new)
    INTO v_found, v_first, v_key_first, v_conflict, v_lock_keys, v_new
    FROM (
        SELECT
            y.i,
            y.first_i,
            y.status,
            y.is_new,
            -- The item a later one with the same run_id replays is the first.
            (
                y.status IS NOT NULL AND (
                    y.queue IS DISTINCT FROM p_queues[y.i] OR y.payload IS DISTINCT FROM p_payloads[y.i]
                    OR y.task IS DISTINCT FROM p_tasks[y.i]
                )
            )
            OR (
                y.status IS NULL AND y.i <> y.first_i
                AND (
                    p_queues[y.first_i] IS DISTINCT FROM p_queues[y.i]
                    OR p_payloads[y.first_i] IS DISTINCT FROM p_payloads[y.i]
                    OR p_tasks[y.first_i] IS DISTINCT FROM p_tasks[y.i]
                )
            ) AS conflict,
            y.is_new AND y.i = min(y.i) FILTER (WHERE y.is_new) OVER (PARTITION BY p_keys[y.i]) AS key_first
        FROM (
            SELECT
                f.i,
                f.first_i,
                e.status,
                e.queue,
                e.payload,
                e.task,
                e.status IS NULL AND f.i = f.first_i AS is_new
            FROM (
                -- generate_subscripts: the same row estimate in custom and
                -- generic plans, so the generic plan is kept.
                SELECT g.i, min(g.i) OVER (PARTITION BY p_run_ids[g.i]) AS first_i
                FROM generate_subscripts(p_run_ids, 1) AS g (i)
            ) AS f
            LEFT JOIN LATERAL (
                SELECT r.status, r.queue, r.payload, r.task
                FROM runs AS r
                WHERE r.run_id = p_run_ids[f.i]
                LIMIT 1
            ) AS e ON TRUE
        ) AS y
    ) AS x;

    IF v_conflict IS NOT NULL THEN
        PERFORM _enqueue_conflict(
            CASE WHEN p_batch THEN format('items[%s].run_id', v_conflict - 1) ELSE 'run_id' END,
            p_run_ids[v_conflict]);
    END IF;

    IF v_new > 0 THEN
        -- Only the new runs' ids: a repeat answers its run as enqueue_run does.
        PERFORM _check_run_owner(
            ARRAY(
                SELECT CASE WHEN v_found[g.i] IS NULL THEN p_run_ids[g.i] END
                FROM generate_subscripts(p_run_ids, 1) AS g (i) ORDER BY g.i
            ),
            p_batch);
        PERFORM _lock_concurrency_keys(v_lock_keys);
        -- A fresh snapshot after the key locks: the keys' live runs as
        -- committed now (one probe of runs_key_live_idx per key's first run).
        WITH created AS (
            INSERT INTO runs AS r (
                run_id, queue, status, priority, concurrency_key, key_position, key_held,
                payload, run_at, max_attempts, payload_retention, created_at, updated_at, ledger_seq,
                trace_context, task
            )
            SELECT
                p_run_ids[n.i], p_queues[n.i], 'queued', p_priorities[n.i], p_keys[n.i], n.key_position,
                p_keys[n.i] IS NOT NULL AND (NOT v_key_first[n.i] OR live.found IS NOT NULL),
                p_payloads[n.i], p_run_ats[n.i], p_max_attempts[n.i], p_payload_retentions[n.i],
                v_now, v_now, 1, p_trace_contexts[n.i], p_tasks[n.i]
            FROM (
                -- Key positions in array order (a volatile output column is
                -- computed after the ORDER BY, and keeps this query apart).
                SELECT
                    g.i,
                    CASE WHEN p_keys[g.i] IS NOT NULL THEN nextval('runs_key_position_seq') END AS key_position
                FROM generate_subscripts(p_run_ids, 1) AS g (i)
                WHERE v_found[g.i] IS NULL AND v_first[g.i] = g.i
                ORDER BY g.i
            ) AS n
            -- A lateral probe, not EXISTS in the select list: the planner may
            -- turn such an EXISTS into a hashed subplan that reads every live
            -- run once (PostgreSQL 18 does, on a plan cached while the table
            -- was empty); a LIMIT keeps this one a probe per key's first run.
            LEFT JOIN LATERAL (
                SELECT true AS found
                FROM runs AS k
                WHERE
                    p_keys[n.i] IS NOT NULL
                    AND v_key_first[n.i]
                    AND k.concurrency_key = p_keys[n.i]
                    AND k.status IN ('queued', 'running', 'waiting')
                LIMIT 1
            ) AS live ON true
            ORDER BY p_run_ids[n.i] COLLATE "C"
            ON CONFLICT ON CONSTRAINT runs_pkey DO NOTHING
            RETURNING r.run_id, r.queue, r.priority, r.concurrency_key, r.key_held, r.run_at
        )
        SELECT
            array_agg(c.run_id),
            array_agg(jsonb_build_object(
                'queue', c.queue,
                'run_at', c.run_at,
                'priority', c.priority,
                'concurrency_key', c.concurrency_key)),
            array_agg(DISTINCT c.queue) FILTER (WHERE _runnable('queued', c.key_held, c.run_at, v_now))
        INTO v_created, v_events, v_wake
        FROM created AS c;

        IF coalesce(cardinality(v_created), 0) < v_new THEN
            -- Lost races: a concurrent enqueue of the same run_id committed
            -- first (the insert waited for it). Each such item is a repeat
            -- of that run; its key's head may be one of this call's runs.
            FOR v_lost IN
                SELECT g.i
                FROM generate_subscripts(p_run_ids, 1) AS g (i)
                WHERE
                    v_found[g.i] IS NULL AND v_first[g.i] = g.i
                    AND p_run_ids[g.i] <> ALL(coalesce(v_created, '{}'::text[]))
                ORDER BY g.i
            LOOP
                SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_ids[v_lost];
                IF v_run.queue IS DISTINCT FROM p_queues[v_lost] OR v_run.payload IS DISTINCT FROM p_payloads[v_lost]
                    OR v_run.task IS DISTINCT FROM p_tasks[v_lost] THEN
                    PERFORM _enqueue_conflict(
                        CASE WHEN p_batch THEN format('items[%s].run_id', v_lost - 1) ELSE 'run_id' END,
                        p_run_ids[v_lost]);
                END IF;
                v_found[v_lost] := v_run.status;
                IF p_keys[v_lost] IS NOT NULL THEN
                    PERFORM _promote_key(p_keys[v_lost]);
                END IF;
            END LOOP;
        END IF;

        IF v_created IS NOT NULL THEN
            PERFORM _emit_lifecycle(
                v_created, array_fill(1::bigint, ARRAY[cardinality(v_created)]), 'run.queued', v_events);
            PERFORM pg_notify(n.channel, w.queue)
            FROM unnest(v_wake) AS w (queue) CROSS JOIN _notifying('runs') AS n (channel);
        END IF;
    END IF;

    RETURN QUERY
    SELECT
        p_run_ids[g.i],
        coalesce(v_found[v_first[g.i]], 'queued'),
        v_found[g.i] IS NULL AND v_first[g.i] = g.i
    FROM generate_subscripts(p_run_ids, 1) AS g (i)
    ORDER BY g.i;
END;
$$;

COMMENT ON FUNCTION _enqueue(
    text[], text[], jsonb[], timestamptz[], integer[], integer[], text[], text[], jsonb[], text[], boolean
) IS
'Enqueues validated runs set-based, each decided as enqueue_run decides it, in array order.';
