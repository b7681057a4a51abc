-- list_schedules(): the schedules by name, a page at a time: names after
-- after_name (the last row of the previous page), at most max_rows. Each
-- row is the declaration (upsert_schedule's arguments, the time zone as
-- pg_timezone_names spells it) and its state: next_slot_at, the next slot
-- enqueue_due_schedules will enqueue (null while disabled; at or before now
-- while it is due), and last_slot_at, the latest slot enqueued (null before
-- the first), whose run is schedule:<name>:<slot in UTC>.
--
-- Reads only: a range of the primary key; no lock.
CREATE TYPE schedule_row AS (
    name text,
    cron text,
    time_zone text,
    queue text,
    payload jsonb,
    priority integer,
    max_attempts integer,
    concurrency_key text,
    missed text,
    enabled boolean,
    next_slot_at timestamptz,
    last_slot_at timestamptz,
    created_at timestamptz,
    updated_at timestamptz
);

CREATE FUNCTION list_schedules(after_name text DEFAULT NULL, max_rows integer DEFAULT 100)
RETURNS SETOF schedule_row
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('after_name', list_schedules.after_name, TRUE);
    PERFORM _check_int('max_rows', list_schedules.max_rows, 1, 1000);
    RETURN QUERY
    SELECT
        s.name, s.cron, s.time_zone, s.queue, s.payload, s.priority, s.max_attempts, s.concurrency_key,
        s.missed, s.enabled, s.next_slot_at, s.last_slot_at, s.created_at, s.updated_at
    FROM schedules AS s
    WHERE list_schedules.after_name IS NULL OR s.name > list_schedules.after_name
    ORDER BY s.name
    LIMIT list_schedules.max_rows;
END;
$$;

COMMENT ON FUNCTION list_schedules(text, integer) IS
'The schedules by name, a page at a time, with their next and latest slots.';
