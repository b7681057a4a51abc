-- Schedules (upsert_schedule, delete_schedule, list_schedules in
-- plpgsql/admin/; enqueue_due_schedules in plpgsql/runs/): periodic work
-- declared once, enqueued as one run per cron slot by whichever maintenance
-- loop takes the due row first.
--
-- cron: five fields (minute hour day-of-month month day-of-week) or a macro,
-- parsed by _cron_parse (plpgsql/schedules/cron.sql) whenever it is used;
-- stored with its whitespace collapsed. time_zone: a name of
-- pg_timezone_names, as that view spells it. queue, payload, priority,
-- max_attempts and concurrency_key are the enqueue_run arguments of every
-- run the schedule makes. missed: what a late maintainer enqueues for slots
-- whose time passed while no one ran it: every one (catch_up) or only the
-- latest (skip).
--
-- next_slot_at: the earliest slot not enqueued yet, null while the schedule
-- is disabled; enqueue_due_schedules takes the rows with next_slot_at at or
-- before the database clock, through schedules_due_idx, so the cost of a
-- round is the due rows', never the others'. last_slot_at: the latest slot
-- enqueued; a schedule changed or enabled again resumes after it, so no slot
-- is enqueued twice whatever the clock does.
CREATE TABLE schedules (
    name text PRIMARY KEY,
    cron text NOT NULL,
    time_zone text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    concurrency_key text,
    missed text NOT NULL,
    enabled boolean NOT NULL,
    next_slot_at timestamptz,
    last_slot_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT schedules_name_length CHECK (length(name) BETWEEN 1 AND 160),
    CONSTRAINT schedules_cron_length CHECK (length(cron) BETWEEN 1 AND 200),
    CONSTRAINT schedules_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT schedules_concurrency_key_length CHECK (
        concurrency_key IS NULL OR length(concurrency_key) BETWEEN 1 AND 200
    ),
    CONSTRAINT schedules_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT schedules_missed CHECK (missed IN ('catch_up', 'skip')),
    CONSTRAINT schedules_enabled_has_next_slot CHECK (enabled = (next_slot_at IS NOT NULL)),
    CONSTRAINT schedules_slots_in_order CHECK (next_slot_at > last_slot_at)
);

CREATE INDEX schedules_due_idx ON schedules (next_slot_at, name)
WHERE next_slot_at IS NOT NULL;
