-- enqueue_due_schedules(): enqueue the runs of the schedules whose slots
-- have come (upsert_schedule), at most max_runs, and move each schedule
-- past them — the maintenance loop's call (runrelay.maintenance).
--
-- Takes due schedules one at a time, earliest next slot first, each row FOR
-- UPDATE SKIP LOCKED: concurrent maintainers share the due schedules and
-- never wait for each other; a row taken is re-checked in a fresh snapshot
-- (a peer that advanced it meanwhile makes it not due). For each: its slots
-- from next_slot_at up to the database clock — all of them with missed
-- catch_up (as many as max_runs leaves room for: the rest stay due for the
-- next call), the latest alone with skip — then next_slot_at is the first
-- slot after those, last_slot_at the latest of them.
--
-- Every slot's run goes through _enqueue as enqueue_run would create it:
-- run_id schedule:<name>:<slot in UTC> (_schedule_run_id), run_at the slot,
-- the schedule's queue, payload, priority, max_attempts and concurrency_key;
-- run.queued emitted, runrelay_runs notified. A slot whose run already
-- exists (a schedule deleted and declared again, a run enqueued by hand
-- under that run_id) is answered as it is, created = false, whatever its
-- payload. The run is created in the transaction that moves the schedule
-- past its slot: either both commit or neither does, so each slot is
-- enqueued once however many maintainers run, and a replay after a lost
-- reply or a restart finds the slot done (and would find its run by its
-- run_id if it were not). A clock set back enqueues nothing until it
-- passes next_slot_at again.
--
-- Returns one row per slot, in the order they were taken: (schedule, slot,
-- run_id, created).
--
-- Locks: schedule rows SKIP LOCKED, taken before any custody lock (one
-- statement per schedule, an index seek of schedules_due_idx: the cost is
-- the due schedules', whatever the number of others); then, in _enqueue,
-- the row locks of new runs' concurrency keys (custody step 1) and the
-- new rows; lanes as an appender.
CREATE TYPE enqueue_due_schedules_result AS (
    schedule text,
    slot timestamptz,
    run_id text,
    created boolean
);

CREATE FUNCTION enqueue_due_schedules(max_runs integer DEFAULT 100)
RETURNS SETOF enqueue_due_schedules_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_now timestamptz;
    v_room integer;
    v_schedule schedules;
    v_spec cron_fields;
    v_slot timestamptz;
    v_slots timestamptz[];
    v_names text[] := '{}'::text[];
    v_all_slots timestamptz[] := '{}'::timestamptz[];
    v_run_ids text[] := '{}'::text[];
    v_queues text[] := '{}'::text[];
    v_payloads jsonb[] := '{}'::jsonb[];
    v_priorities integer[] := '{}'::integer[];
    v_max_attempts integer[] := '{}'::integer[];
    v_keys text[] := '{}'::text[];
    v_new integer[];
    v_created text[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_int('max_runs', enqueue_due_schedules.max_runs, 1, 10000);
    v_now := _now();
    v_room := enqueue_due_schedules.max_runs;

    WHILE v_room > 0 LOOP
        -- A schedule this call moved is not due any more (its row as this
        -- transaction wrote it); one it stopped short of, for want of room,
        -- ends the loop.
        SELECT s.* INTO v_schedule
        FROM schedules AS s
        WHERE s.next_slot_at <= v_now
        ORDER BY s.next_slot_at, s.name
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN v_schedule.name IS NULL;

        v_spec := _cron_parse(v_schedule.cron);
        IF v_schedule.missed = 'catch_up' THEN
            v_slots := '{}'::timestamptz[];
            v_slot := v_schedule.next_slot_at;
            WHILE v_slot <= v_now AND cardinality(v_slots) < v_room LOOP
                v_slots := v_slots || v_slot;
                v_slot := _cron_next(v_spec, v_schedule.time_zone, v_slot);
            END LOOP;
        ELSE
            v_slots := ARRAY[_cron_latest(v_spec, v_schedule.time_zone, v_schedule.next_slot_at, v_now)];
            v_slot := _cron_next(v_spec, v_schedule.time_zone, v_slots[1]);
        END IF;
        UPDATE schedules AS s
        SET next_slot_at = v_slot, last_slot_at = v_slots[cardinality(v_slots)]
        WHERE s.name = v_schedule.name;

        v_names := v_names || array_fill(v_schedule.name, ARRAY[cardinality(v_slots)]);
        v_all_slots := v_all_slots || v_slots;
        v_run_ids := v_run_ids || ARRAY(
            SELECT _schedule_run_id(v_schedule.name, x.slot) FROM unnest(v_slots) WITH ORDINALITY AS x (slot, n)
            ORDER BY x.n
        );
        v_queues := v_queues || array_fill(v_schedule.queue, ARRAY[cardinality(v_slots)]);
        v_payloads := v_payloads || array_fill(v_schedule.payload, ARRAY[cardinality(v_slots)]);
        v_priorities := v_priorities || array_fill(v_schedule.priority, ARRAY[cardinality(v_slots)]);
        v_max_attempts := v_max_attempts || array_fill(v_schedule.max_attempts, ARRAY[cardinality(v_slots)]);
        v_keys := v_keys || array_fill(v_schedule.concurrency_key, ARRAY[cardinality(v_slots)]);
        v_room := v_room - cardinality(v_slots);
        v_schedule := NULL;
    END LOOP;

    IF cardinality(v_run_ids) = 0 THEN
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;

    -- The slots whose run does not exist yet, one primary-key probe each
    -- (LATERAL ... LIMIT 1, as _enqueue looks its items up).
    SELECT array_agg(g.i ORDER BY g.i) INTO v_new
    FROM generate_subscripts(v_run_ids, 1) AS g (i)
    LEFT JOIN LATERAL (
        SELECT r.run_id FROM runs AS r
        WHERE r.run_id = v_run_ids[g.i]
        LIMIT 1
    ) AS e ON TRUE
    WHERE e.run_id IS NULL;
    IF v_new IS NOT NULL THEN
        SELECT array_agg(e.run_id) FILTER (WHERE e.created) INTO v_created
        FROM _enqueue(
            ARRAY(SELECT v_run_ids[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            ARRAY(SELECT v_queues[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            ARRAY(SELECT v_payloads[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            ARRAY(SELECT v_all_slots[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            ARRAY(SELECT v_priorities[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            ARRAY(SELECT v_max_attempts[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            array_fill('keep'::text, ARRAY[cardinality(v_new)]),
            ARRAY(SELECT v_keys[n.i] FROM unnest(v_new) WITH ORDINALITY AS n (i, o) ORDER BY n.o),
            -- No trace context: a slot's run starts its own trace (no
            -- producer traced it; the maintainer only noticed it was due).
            array_fill(NULL::jsonb, ARRAY[cardinality(v_new)]),
            -- Untyped: a schedule names a queue, not a task.
            array_fill(NULL::text, ARRAY[cardinality(v_new)]),
            FALSE
        ) AS e;
    END IF;

    RETURN QUERY
    SELECT v_names[g.i], v_all_slots[g.i], v_run_ids[g.i], v_run_ids[g.i] = ANY(coalesce(v_created, '{}'::text[]))
    FROM generate_subscripts(v_run_ids, 1) AS g (i)
    ORDER BY g.i;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION enqueue_due_schedules(integer) IS
'Enqueues the runs of due schedule slots (at most max_runs), each slot once, and moves the schedules past them.';
