-- Cron expressions: parsing, and the slots of an expression in a time zone.
--
-- An expression has five fields, minute (0-59), hour (0-23), day-of-month
-- (1-31), month (1-12 or jan-dec) and day-of-week (0-7 or sun-sat; 0 and 7
-- are Sunday), separated by blanks. A field is a comma-separated list of
-- items; an item is *, a value, or a range a-b, each optionally followed by
-- /step (a/step alone means a up to the field's maximum). Names are
-- case-insensitive. @yearly (@annually), @monthly, @weekly, @daily
-- (@midnight) and @hourly stand for their usual five fields.
--
-- Days follow Vixie cron: when day-of-month and day-of-week are both
-- restricted, a day matches if either matches; when either field starts
-- with *, a day matches if both match (so '0 0 */2 * 1' is odd days that
-- are Mondays, as in Vixie cron and cronie).
--
-- A slot is a local time the fields match, as an instant in the schedule's
-- time zone. Wall-clock times that a daylight-saving change skips or repeats
-- are mapped once each (docs/operations.md, "Periodic runs"):
--   * a local time in a gap (spring forward) is the first instant after the
--     gap: 02:30 on the night New York skips 02:00-03:00 is 03:00 EDT, and
--     every slot in the gap is that one instant (one run);
--   * a local time that occurs twice (fall back) is its first occurrence,
--     once: 01:30 on the night New York repeats 01:00-02:00 is 01:30 EDT,
--     and the repeated hour has no slot of its own.
-- Slots are distinct instants in increasing order; an expression that runs
-- at fixed intervals through the night should use time_zone UTC.
--
-- Local times are timestamp values (no time zone), whose arithmetic is the
-- calendar's; instants are timestamptz, moved only by hours, never by days
-- (a day of timestamptz arithmetic depends on the session's TimeZone).

-- The fields of a parsed expression as bit sets: bit n set when value n
-- matches. days_star/weekdays_star: the field starts with * (the Vixie
-- day rule above).
CREATE TYPE cron_fields AS (
    minutes bigint,
    hours bigint,
    days bigint,
    months bigint,
    weekdays bigint,
    days_star boolean,
    weekdays_star boolean
);

CREATE FUNCTION _cron_hint()
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN 'Pass five fields, minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or jan-dec) '
        'day-of-week (0-7 or sun-sat, 0 and 7 are Sunday), each *, a value, a range a-b or a list a,b,c, '
        'with an optional /step; or @yearly, @monthly, @weekly, @daily, @hourly.';
END;
$$;

COMMENT ON FUNCTION _cron_hint() IS
'The HINT of a rejected cron expression: the syntax the parser accepts.';

-- One value (p_text) of a field (p_field_text): digits, or a name of p_names
-- (the value of the n-th name is p_min + n - 1). Raises 22023 naming the
-- field.
CREATE FUNCTION _cron_value(p_field text, p_field_text text, p_text text, p_min integer, p_max integer, p_names text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_value integer;
BEGIN
    IF p_text ~ '^[0-9]{1,4}$' THEN
        v_value := p_text::integer;
    ELSIF array_position(p_names, p_text) IS NOT NULL THEN
        v_value := p_min + array_position(p_names, p_text) - 1;
    ELSE
        PERFORM _invalid('cron', format('%s field %s: %s', p_field, _quote(p_field_text),
            CASE
                WHEN coalesce(p_text, '') = '' THEN 'a value is missing'
                ELSE _quote(p_text) || ' is not a number' || CASE WHEN p_names IS NULL THEN '' ELSE ' or name' END
            END), _cron_hint());
    END IF;
    IF v_value NOT BETWEEN p_min AND p_max THEN
        PERFORM _invalid('cron', format('%s field %s: %s is out of range %s-%s',
            p_field, _quote(p_field_text), v_value, p_min, p_max), _cron_hint());
    END IF;
    RETURN v_value;
END;
$$;

COMMENT ON FUNCTION _cron_value(text, text, text, integer, integer, text[]) IS
'One value of a cron field (digits or a name), in range, or 22023 naming the field.';

-- One field as a bit set (see cron_fields). Raises 22023 naming the field.
CREATE FUNCTION _cron_field(p_field text, p_text text, p_min integer, p_max integer, p_names text[])
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_item text;
    v_parts text[];
    v_bounds text[];
    v_step integer;
    v_low integer;
    v_high integer;
    v_mask bigint := 0;
BEGIN
    FOREACH v_item IN ARRAY string_to_array(p_text, ',') LOOP
        v_parts := string_to_array(v_item, '/');
        IF cardinality(v_parts) > 2 THEN
            PERFORM _invalid('cron', format('%s field %s: more than one /step', p_field, _quote(p_text)), _cron_hint());
        END IF;
        v_step := 1;
        IF cardinality(v_parts) = 2 THEN
            IF v_parts[2] !~ '^[0-9]{1,4}$' OR v_parts[2]::integer = 0 THEN
                PERFORM _invalid('cron', format('%s field %s: the step must be a positive integer',
                    p_field, _quote(p_text)), _cron_hint());
            END IF;
            v_step := v_parts[2]::integer;
        END IF;
        IF v_parts[1] = '*' THEN
            v_low := p_min;
            v_high := p_max;
        ELSE
            v_bounds := string_to_array(v_parts[1], '-');
            IF cardinality(v_bounds) > 2 THEN
                PERFORM _invalid('cron', format('%s field %s: a range has two ends', p_field, _quote(p_text)), _cron_hint());
            END IF;
            v_low := _cron_value(p_field, p_text, v_bounds[1], p_min, p_max, p_names);
            IF cardinality(v_bounds) = 2 THEN
                v_high := _cron_value(p_field, p_text, v_bounds[2], p_min, p_max, p_names);
                IF v_high < v_low THEN
                    PERFORM _invalid('cron', format('%s field %s: the range runs backwards', p_field, _quote(p_text)),
                        _cron_hint());
                END IF;
            ELSIF cardinality(v_parts) = 2 THEN
                v_high := p_max;
            ELSE
                v_high := v_low;
            END IF;
        END IF;
        FOR v_value IN v_low..v_high BY v_step LOOP
            v_mask := v_mask | (1::bigint << v_value);
        END LOOP;
    END LOOP;
    RETURN v_mask;
END;
$$;

COMMENT ON FUNCTION _cron_field(text, text, integer, integer, text[]) IS
'One cron field as a bit set of its values, or 22023 naming the field.';

-- _cron_parse(): an expression's fields, or 22023 (parameter cron) naming
-- the field that is wrong. Also refuses an expression no date can match
-- (day 30 of February): its next slot would never come.
CREATE FUNCTION _cron_parse(p_cron text)
RETURNS cron_fields
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_text text := lower(btrim(p_cron, E' \t\n\r'));
    v_fields text[];
    v_spec cron_fields;
BEGIN
    IF p_cron IS NULL THEN
        PERFORM _invalid('cron', 'must not be null', _cron_hint());
    END IF;
    IF length(p_cron) > 200 THEN
        PERFORM _invalid('cron', format('must be at most 200 characters (got %s)', length(p_cron)), _cron_hint());
    END IF;
    v_text := CASE v_text
        WHEN '@yearly' THEN '0 0 1 1 *'
        WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *'
        WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *'
        ELSE v_text
    END;
    v_fields := CASE WHEN v_text = '' THEN '{}'::text[] ELSE regexp_split_to_array(v_text, '[[:space:]]+') END;
    IF cardinality(v_fields) <> 5 THEN
        PERFORM _invalid('cron',
            format('must have five fields, minute hour day-of-month month day-of-week (got %s)',
                cardinality(v_fields)),
            _cron_hint());
    END IF;
    v_spec.minutes := _cron_field('minute', v_fields[1], 0, 59, NULL);
    v_spec.hours := _cron_field('hour', v_fields[2], 0, 23, NULL);
    v_spec.days := _cron_field('day-of-month', v_fields[3], 1, 31, NULL);
    v_spec.months := _cron_field('month', v_fields[4], 1, 12,
        ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']);
    v_spec.weekdays := _cron_field('day-of-week', v_fields[5], 0, 7,
        ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']);
    -- 7 is Sunday too.
    IF (v_spec.weekdays & 128) <> 0 THEN
        v_spec.weekdays := (v_spec.weekdays & 127) | 1;
    END IF;
    v_spec.days_star := left(v_fields[3], 1) = '*';
    v_spec.weekdays_star := left(v_fields[5], 1) = '*';
    -- Both fields restricted: any matching weekday will do. Otherwise a day
    -- must be one of the listed days of a listed month (day 29 of February
    -- counts: it comes every four years, on every weekday in turn).
    IF v_spec.days_star OR v_spec.weekdays_star THEN
        FOR v_month IN 1..12 LOOP
            IF (v_spec.months >> v_month) & 1 = 1
                AND (v_spec.days & ((2::bigint << CASE
                    WHEN v_month = 2 THEN 29 WHEN v_month IN (4, 6, 9, 11) THEN 30 ELSE 31 END) - 2)) <> 0 THEN
                RETURN v_spec;
            END IF;
        END LOOP;
        PERFORM _invalid('cron', format('day-of-month field %s never falls in month field %s',
            _quote(v_fields[3]), _quote(v_fields[4])), _cron_hint());
    END IF;
    RETURN v_spec;
END;
$$;

COMMENT ON FUNCTION _cron_parse(text) IS
'Parses a cron expression into its fields, or 22023 (cron) naming the field that is wrong.';

-- Whether a local date matches the day fields (the Vixie rule above).
CREATE FUNCTION _cron_day_matches(p_spec cron_fields, p_local timestamp)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_day boolean := (p_spec.days >> extract(DAY FROM p_local)::integer) & 1 = 1;
    v_weekday boolean := (p_spec.weekdays >> extract(DOW FROM p_local)::integer) & 1 = 1;
BEGIN
    IF p_spec.days_star OR p_spec.weekdays_star THEN
        RETURN v_day AND v_weekday;
    END IF;
    RETURN v_day OR v_weekday;
END;
$$;

COMMENT ON FUNCTION _cron_day_matches(cron_fields, timestamp) IS
'Whether a local date matches the day-of-month and day-of-week fields (Vixie: either, if both are restricted).';

-- Leaves the month, day or hour holding p_at: forward, for the next one's
-- first minute; backward, for the previous one's last.
CREATE FUNCTION _cron_leave(p_at timestamp, p_unit text, p_forward boolean)
RETURNS timestamp
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_forward THEN
        RETURN date_trunc(p_unit, p_at) + ('1 ' || p_unit)::interval;
    END IF;
    RETURN date_trunc(p_unit, p_at) - interval '1 minute';
END;
$$;

COMMENT ON FUNCTION _cron_leave(timestamp, text, boolean) IS
'The first minute of the next month, day or hour (forward), or the last minute of the previous one.';

-- The nearest value after p_from, towards p_bound (inclusive, either side
-- of p_from), whose bit is set in a field's mask; NULL when there is none.
CREATE FUNCTION _cron_nearest(p_mask bigint, p_from integer, p_bound integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_way integer := sign(p_bound - p_from)::integer;
BEGIN
    FOR v_step IN 1..abs(p_bound - p_from) LOOP
        IF (p_mask >> (p_from + v_way * v_step)) & 1 = 1 THEN
            RETURN p_from + v_way * v_step;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _cron_nearest(bigint, integer, integer) IS
'The nearest value after a field value, towards a bound, that the field''s mask holds; NULL if none.';

-- The local minute nearest p_local (at or after it when p_forward, at or
-- before it otherwise) that the fields match. Steps field by field: a
-- month, a day, an hour or a minute that does not match is left for the
-- next one's first minute (forward) or the previous one's last (backward);
-- an hour or a minute goes straight to the nearest matching value in its
-- day or hour when there is one. An expression _cron_parse accepted matches
-- within 28 years (a leap day on a given weekday), a few thousand steps at
-- most.
CREATE FUNCTION _cron_step_local(p_spec cron_fields, p_local timestamp, p_forward boolean)
RETURNS timestamp
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at timestamp := date_trunc('minute', p_local);
    v_found integer;
BEGIN
    FOR v_step IN 1..100000 LOOP
        IF (p_spec.months >> extract(MONTH FROM v_at)::integer) & 1 = 0 THEN
            v_at := _cron_leave(v_at, 'month', p_forward);
            CONTINUE;
        END IF;
        IF NOT _cron_day_matches(p_spec, v_at) THEN
            v_at := _cron_leave(v_at, 'day', p_forward);
            CONTINUE;
        END IF;
        IF (p_spec.hours >> extract(HOUR FROM v_at)::integer) & 1 = 0 THEN
            v_found := _cron_nearest(
                p_spec.hours, extract(HOUR FROM v_at)::integer, CASE WHEN p_forward THEN 23 ELSE 0 END);
            v_at := CASE
                WHEN v_found IS NULL THEN _cron_leave(v_at, 'day', p_forward)
                WHEN p_forward THEN date_trunc('day', v_at) + make_interval(hours => v_found)
                ELSE date_trunc('day', v_at) + make_interval(hours => v_found, mins => 59)
            END;
            CONTINUE;
        END IF;
        IF (p_spec.minutes >> extract(MINUTE FROM v_at)::integer) & 1 = 0 THEN
            v_found := _cron_nearest(
                p_spec.minutes, extract(MINUTE FROM v_at)::integer, CASE WHEN p_forward THEN 59 ELSE 0 END);
            v_at := CASE
                WHEN v_found IS NULL THEN _cron_leave(v_at, 'hour', p_forward)
                ELSE date_trunc('hour', v_at) + make_interval(mins => v_found)
            END;
            CONTINUE;
        END IF;
        RETURN v_at;
    END LOOP;
    RAISE EXCEPTION 'runrelay: no time matches the cron fields % %',
        CASE WHEN p_forward THEN 'after' ELSE 'before' END, p_local
        USING ERRCODE = 'internal_error';
END;
$$;

COMMENT ON FUNCTION _cron_step_local(cron_fields, timestamp, boolean) IS
'The local minute nearest a local time, at or after it (forward) or at or before it, that the cron fields match.';

-- The instant of a local time in a time zone, by the rules at the top: the
-- first occurrence of a repeated local time, the first instant after a gap
-- for a skipped one. PostgreSQL's own `AT TIME ZONE` reads a repeated time
-- as its later occurrence (standard time) and a skipped one with the offset
-- before the change (02:30 in a 02:00-03:00 gap is 03:30), so both are
-- corrected here.
CREATE FUNCTION _cron_instant(p_local timestamp, p_time_zone text)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at timestamptz := p_local AT TIME ZONE p_time_zone;
    v_before timestamptz;
    v_earlier timestamptz;
    v_low timestamptz;
    v_high timestamptz;
    v_mid timestamptz;
BEGIN
    IF (v_at AT TIME ZONE p_time_zone) = p_local THEN
        -- A repeated local time's earlier occurrence has the offset in
        -- force before the change, a day (24 hours) before at the latest.
        v_before := v_at - interval '24 hours';
        v_earlier := (p_local AT TIME ZONE 'UTC')
            - ((v_before AT TIME ZONE p_time_zone) - (v_before AT TIME ZONE 'UTC'));
        IF v_earlier < v_at AND (v_earlier AT TIME ZONE p_time_zone) = p_local THEN
            RETURN v_earlier;
        END IF;
        RETURN v_at;
    END IF;
    -- In a gap: v_at is already past it. The first instant whose local time
    -- is past p_local, to the second, by bisection (gaps are shorter than
    -- two days; changes happen on whole seconds).
    v_low := v_at - interval '48 hours';
    v_high := v_at;
    WHILE v_high - v_low > interval '1 second' LOOP
        v_mid := date_trunc('second', v_low + (v_high - v_low) / 2);
        IF (v_mid AT TIME ZONE p_time_zone) < p_local THEN
            v_low := v_mid;
        ELSE
            v_high := v_mid;
        END IF;
    END LOOP;
    RETURN v_high;
END;
$$;

COMMENT ON FUNCTION _cron_instant(timestamp, text) IS
'The instant of a local time in a time zone: a repeated time''s first occurrence, a skipped time''s first instant after the gap.';

-- _cron_next(): the first slot strictly after p_after. A local time whose
-- instant is not after p_after (the repeated hour, read as its first
-- occurrence, while p_after is in its second) is passed over.
CREATE FUNCTION _cron_next(p_spec cron_fields, p_time_zone text, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_local timestamp := date_trunc('minute', p_after AT TIME ZONE p_time_zone) + interval '1 minute';
    v_at timestamptz;
BEGIN
    FOR v_step IN 1..10000 LOOP
        v_local := _cron_step_local(p_spec, v_local, TRUE);
        v_at := _cron_instant(v_local, p_time_zone);
        IF v_at > p_after THEN
            RETURN v_at;
        END IF;
        v_local := v_local + interval '1 minute';
    END LOOP;
    RAISE EXCEPTION 'runrelay: no cron slot found after %', p_after
        USING ERRCODE = 'internal_error';
END;
$$;

COMMENT ON FUNCTION _cron_next(cron_fields, text, timestamptz) IS
'The first slot of cron fields in a time zone strictly after an instant.';

-- _cron_latest(): the latest slot at or before p_now, given p_from, a slot
-- at or before p_now. One step back from p_now's local time finds it (or a
-- slot shortly before it, around a repeated hour); steps forward from there
-- make it exact. Never earlier than p_from.
CREATE FUNCTION _cron_latest(p_spec cron_fields, p_time_zone text, p_from timestamptz, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_best timestamptz := p_from;
    v_at timestamptz;
BEGIN
    v_at := _cron_instant(_cron_step_local(p_spec, p_now AT TIME ZONE p_time_zone, FALSE), p_time_zone);
    IF v_at <= p_now AND v_at > v_best THEN
        v_best := v_at;
    END IF;
    FOR v_step IN 1..1000 LOOP
        v_at := _cron_next(p_spec, p_time_zone, v_best);
        EXIT WHEN v_at > p_now;
        v_best := v_at;
    END LOOP;
    RETURN v_best;
END;
$$;

COMMENT ON FUNCTION _cron_latest(cron_fields, text, timestamptz, timestamptz) IS
'The latest slot of cron fields in a time zone at or before an instant, and not before a given slot.';
