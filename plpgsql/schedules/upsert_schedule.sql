-- upsert_schedule(): declare periodic work, or change a declaration.
--
-- A schedule enqueues one run per slot of its cron expression in its time
-- zone (plpgsql/schedules/cron.sql; docs/operations.md, "Periodic runs"),
-- with the given queue, payload, priority, max_attempts and concurrency_key,
-- run_at the slot and run_id schedule:<name>:<slot in UTC>
-- (_schedule_run_id). missed: what a maintainer that comes late enqueues
-- for the slots that passed: catch_up every one (at most enqueue_due_schedules'
-- max_runs a call), skip only the latest. enabled false keeps the
-- declaration and enqueues nothing.
--
-- Outcomes: created (a new name; its first slot is the first after now),
-- updated (something changed), unchanged (the declaration is already this
-- one: nothing is written). A changed cron or time zone, or a schedule
-- enabled again, starts at the first slot after now and after the latest
-- slot already enqueued: slots missed while it was disabled are not
-- enqueued, and no slot is enqueued twice. Any other change keeps the
-- schedule's place; slots not enqueued yet get the new arguments.
--
-- Locks: the schedule's row, waiting under the bounded lock wait (10 s, or
-- the caller's tighter lock_timeout) for an enqueue_due_schedules that holds
-- it; a new name's insert waits for a concurrent insert of the same name. A
-- repeat is safe: unchanged.
CREATE FUNCTION upsert_schedule(
    name text,
    cron text,
    time_zone text DEFAULT 'UTC',
    queue text DEFAULT 'default',
    payload jsonb DEFAULT '{}',
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT 3,
    concurrency_key text DEFAULT NULL,
    missed text DEFAULT 'skip',
    enabled boolean DEFAULT TRUE
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_cron text;
    v_spec cron_fields;
    v_time_zone text;
    v_now timestamptz;
    v_old schedules;
    v_next timestamptz;
    v_inserted text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('name', upsert_schedule.name);
    IF length(upsert_schedule.name) > 160 THEN
        PERFORM _invalid('name', format('must be at most 160 characters (got %s)', length(upsert_schedule.name)),
            'Pass a schedule name of 1 to 160 characters: its run_ids add the slot to it.');
    END IF;
    v_spec := _cron_parse(upsert_schedule.cron);
    v_cron := regexp_replace(btrim(upsert_schedule.cron, E' \t\n\r'), '[[:space:]]+', ' ', 'g');
    v_time_zone := _check_time_zone(upsert_schedule.time_zone);
    PERFORM _check_schedule_owner(upsert_schedule.name);
    PERFORM _check_id('queue', upsert_schedule.queue);
    PERFORM _check_json('payload', upsert_schedule.payload);
    PERFORM _check_int('priority', upsert_schedule.priority, -1000000, 1000000);
    PERFORM _check_int('max_attempts', upsert_schedule.max_attempts, 1, 1000);
    PERFORM _check_id('concurrency_key', upsert_schedule.concurrency_key, TRUE);
    IF upsert_schedule.missed IS NULL OR upsert_schedule.missed NOT IN ('catch_up', 'skip') THEN
        PERFORM _invalid('missed', format('must be catch_up or skip (got %s)', _quote(upsert_schedule.missed)),
            'Pass catch_up (enqueue every missed slot) or skip (only the latest).');
    END IF;
    IF upsert_schedule.enabled IS NULL THEN
        PERFORM _invalid('enabled', 'must not be null', 'Pass true or false.');
    END IF;
    v_now := _now();

    -- A new name is inserted; an existing one is locked. A schedule deleted
    -- between the two is inserted again on the next turn.
    LOOP
        INSERT INTO schedules AS s (
            name, cron, time_zone, queue, payload, priority, max_attempts, concurrency_key, missed, enabled,
            next_slot_at, created_at, updated_at
        )
        VALUES (
            upsert_schedule.name, v_cron, v_time_zone, upsert_schedule.queue, upsert_schedule.payload,
            upsert_schedule.priority, upsert_schedule.max_attempts, upsert_schedule.concurrency_key,
            upsert_schedule.missed, upsert_schedule.enabled,
            CASE WHEN upsert_schedule.enabled THEN _cron_next(v_spec, v_time_zone, v_now) END, v_now, v_now
        )
        ON CONFLICT ON CONSTRAINT schedules_pkey DO NOTHING
        RETURNING s.name INTO v_inserted;
        IF v_inserted IS NOT NULL THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, 'created'::text);
        END IF;
        SELECT s.* INTO v_old FROM schedules AS s WHERE s.name = upsert_schedule.name FOR UPDATE;
        EXIT WHEN v_old.name IS NOT NULL;
    END LOOP;
    IF (v_old.cron, v_old.time_zone, v_old.queue, v_old.payload, v_old.priority, v_old.max_attempts,
        v_old.concurrency_key, v_old.missed, v_old.enabled)
        IS NOT DISTINCT FROM (v_cron, v_time_zone, upsert_schedule.queue, upsert_schedule.payload,
            upsert_schedule.priority, upsert_schedule.max_attempts, upsert_schedule.concurrency_key,
            upsert_schedule.missed, upsert_schedule.enabled) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'unchanged'::text);
    END IF;

    v_next := v_old.next_slot_at;
    IF NOT upsert_schedule.enabled THEN
        v_next := NULL;
    ELSIF NOT v_old.enabled OR v_old.cron IS DISTINCT FROM v_cron OR v_old.time_zone IS DISTINCT FROM v_time_zone THEN
        v_next := _cron_next(v_spec, v_time_zone, greatest(v_now, v_old.last_slot_at));
    END IF;
    UPDATE schedules AS s
    SET
        cron = v_cron,
        time_zone = v_time_zone,
        queue = upsert_schedule.queue,
        payload = upsert_schedule.payload,
        priority = upsert_schedule.priority,
        max_attempts = upsert_schedule.max_attempts,
        concurrency_key = upsert_schedule.concurrency_key,
        missed = upsert_schedule.missed,
        enabled = upsert_schedule.enabled,
        next_slot_at = v_next,
        updated_at = v_now
    WHERE s.name = upsert_schedule.name;
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'updated'::text);
END;
$$;

COMMENT ON FUNCTION upsert_schedule(text, text, text, text, jsonb, integer, integer, text, text, boolean) IS
'Declares or changes a schedule, periodic runs of a cron expression in a time zone: created, updated or unchanged.';
