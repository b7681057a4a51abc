-- Schedules (plpgsql/schema/10_schedules.sql): the checks of a declaration
-- that only schedules need, and the run_id of a slot.

-- A time zone: a name pg_timezone_names lists (any letter case), returned
-- as that view spells it. Reading the view costs some 30 ms (it lists the
-- time zone files): a declaration pays it, a round of enqueue_due_schedules
-- never does.
CREATE FUNCTION _check_time_zone(p_time_zone text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hint constant text := 'Pass a time zone name of pg_timezone_names, e.g. UTC, Europe/Berlin or America/New_York.';
    v_name text;
BEGIN
    IF p_time_zone IS NULL THEN
        PERFORM _invalid('time_zone', 'must not be null', v_hint);
    END IF;
    IF length(p_time_zone) > 200 THEN
        PERFORM _invalid('time_zone', format('must be at most 200 characters (got %s)', length(p_time_zone)), v_hint);
    END IF;
    SELECT z.name INTO v_name
    FROM pg_catalog.pg_timezone_names AS z
    WHERE lower(z.name) = lower(p_time_zone)
    ORDER BY z.name = p_time_zone DESC, z.name
    LIMIT 1;
    IF v_name IS NULL THEN
        PERFORM _invalid('time_zone', format('unknown time zone %s', _quote(p_time_zone)), v_hint);
    END IF;
    RETURN v_name;
END;
$$;

COMMENT ON FUNCTION _check_time_zone(text) IS
'Validates a time zone name against pg_timezone_names; returns it as the view spells it.';

-- The run_id of a schedule's slot: schedule:<name>:<slot in UTC, ISO 8601
-- to the second>, e.g. schedule:nightly:2030-01-01T02:00:00Z. A slot's run
-- is named by the slot alone, so enqueueing it again (a second maintainer,
-- a replay, a restart) answers the same run with created = false. Names
-- are at most 160 characters, so the run_id fits the 200 of every run_id.
CREATE FUNCTION _schedule_run_id(p_name text, p_slot timestamptz)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN 'schedule:' || p_name || ':' || to_char(p_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
END;
$$;

COMMENT ON FUNCTION _schedule_run_id(text, timestamptz) IS
'The run_id of a schedule''s slot: schedule:<name>:<slot in UTC, ISO 8601>.';
