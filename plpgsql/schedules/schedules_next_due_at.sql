-- schedules_next_due_at(): when the next schedule slot comes, for a
-- maintenance loop deciding how long to sleep: next_slot_at, the earliest
-- next slot of an enabled schedule (null when there is none), and due_in_ms,
-- the milliseconds from the database clock to it (0 when it is due now;
-- null with no slot). The wait is measured by the database, so a host whose
-- clock is off wakes neither early nor late. One probe of
-- schedules_due_idx, whatever the number of schedules; no lock.
CREATE TYPE schedules_next_due AS (
    next_slot_at timestamptz,
    due_in_ms bigint
);

CREATE FUNCTION schedules_next_due_at()
RETURNS SETOF schedules_next_due
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_next timestamptz;
BEGIN
    PERFORM _require_read_committed();
    SELECT min(s.next_slot_at) INTO v_next FROM schedules AS s;
    RETURN QUERY
    SELECT v_next, CASE
        WHEN v_next IS NOT NULL THEN greatest(0, ceil(extract(EPOCH FROM v_next - _clock_now()) * 1000))::bigint
    END;
END;
$$;

COMMENT ON FUNCTION schedules_next_due_at() IS
'The earliest next slot of an enabled schedule, and the milliseconds until it by the database clock.';
