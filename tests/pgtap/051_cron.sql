-- Cron expressions (plpgsql/schedules/cron.sql; docs/operations.md,
-- "Periodic runs"): the fields, lists, ranges, steps, names and macros;
-- Vixie's day rule; slots across daylight-saving changes in Europe/Berlin
-- and America/New_York (a skipped local time is the first instant after
-- the gap, a repeated one runs once, at its first occurrence); the latest
-- slot for missed skip; every malformed expression is 22023 naming its
-- field.
BEGIN;
SELECT plan(42);

-- The first p_count slots of an expression strictly after p_after, in UTC.
CREATE FUNCTION pg_temp.slots(p_cron text, p_time_zone text, p_after timestamptz, p_count integer)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_spec runrelay.cron_fields := runrelay._cron_parse(p_cron);
    v_at timestamptz := p_after;
    v_out text[] := '{}';
BEGIN
    FOR i IN 1..p_count LOOP
        v_at := runrelay._cron_next(v_spec, p_time_zone, v_at);
        v_out := v_out || to_char(v_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI');
    END LOOP;
    RETURN v_out;
END;
$$;

-- Fields, lists, ranges, steps, names.
SELECT is(pg_temp.slots(c.cron, c.time_zone, c.after::timestamptz, c.n), c.expected, c.description)
FROM (
    VALUES
    (
        '*/15 * * * *', 'UTC', '2030-01-01 00:07Z', 4, '*/15: every quarter hour',
        ARRAY['2030-01-01 00:15', '2030-01-01 00:30', '2030-01-01 00:45', '2030-01-01 01:00']
    ),
    (
        '1-5/2 0 * * *', 'UTC', '2030-01-01 00:00Z', 4, '1-5/2: a range with a step',
        ARRAY['2030-01-01 00:01', '2030-01-01 00:03', '2030-01-01 00:05', '2030-01-02 00:01']
    ),
    (
        '5/20 8 * * *', 'UTC', '2030-01-01 00:00Z', 4, '5/20: from a value to the field''s end',
        ARRAY['2030-01-01 08:05', '2030-01-01 08:25', '2030-01-01 08:45', '2030-01-02 08:05']
    ),
    (
        '0,30 6,18 * * *', 'UTC', '2030-01-01 06:00Z', 4, 'lists in two fields',
        ARRAY['2030-01-01 06:30', '2030-01-01 18:00', '2030-01-01 18:30', '2030-01-02 06:00']
    ),
    -- 2030-01-04 is a Friday.
    (
        '0 9-17/4 * * mon-fri', 'UTC', '2030-01-04 12:00Z', 4, 'weekday names and an hour range with a step: weekends skipped',
        ARRAY['2030-01-04 13:00', '2030-01-04 17:00', '2030-01-07 09:00', '2030-01-07 13:00']
    ),
    (
        '0 0 1 JAN,jul *', 'UTC', '2030-01-01 00:00Z', 3, 'month names, in any letter case',
        ARRAY['2030-07-01 00:00', '2031-01-01 00:00', '2031-07-01 00:00']
    ),
    (
        '0 12 * * 7', 'UTC', '2030-01-01 00:00Z', 2, 'day-of-week 7 is Sunday, as 0 is',
        pg_temp.slots('0 12 * * 0', 'UTC', '2030-01-01 00:00Z', 2)
    ),
    ('0 12 * * sun', 'UTC', '2030-01-01 00:00Z', 2, 'sun', ARRAY['2030-01-06 12:00', '2030-01-13 12:00']),
    (
        '0 0 29 2 *', 'UTC', '2097-03-01Z', 2, 'the 29th of February: leap years only (2100 is not one)',
        ARRAY['2104-02-29 00:00', '2108-02-29 00:00']
    ),
    -- Vixie's day rule.
    (
        '0 0 13 * fri', 'UTC', '2030-09-01Z', 4, 'both day fields restricted: the 13th or a Friday',
        ARRAY['2030-09-06 00:00', '2030-09-13 00:00', '2030-09-20 00:00', '2030-09-27 00:00']
    ),
    (
        '0 0 13 * fri', 'UTC', '2030-10-01Z', 3, 'a 13th that is no Friday matches too',
        ARRAY['2030-10-04 00:00', '2030-10-11 00:00', '2030-10-13 00:00']
    ),
    (
        '0 0 */2 * mon', 'UTC', '2030-01-01Z', 3, 'a day-of-month field starting with *: odd days that are Mondays',
        ARRAY['2030-01-07 00:00', '2030-01-21 00:00', '2030-02-11 00:00']
    )
) AS c (cron, time_zone, after, n, description, expected);

-- Macros.
SELECT is(
    pg_temp.slots('@hourly', 'UTC', '2030-01-01 00:30Z', 1) || pg_temp.slots('@DAILY', 'UTC', '2030-01-01 00:30Z', 1)
    || pg_temp.slots('@midnight', 'UTC', '2030-01-01 00:30Z', 1)
    || pg_temp.slots('@weekly', 'UTC', '2030-01-01 00:30Z', 1)
    || pg_temp.slots('@monthly', 'UTC', '2030-01-01 00:30Z', 1)
    || pg_temp.slots('@yearly', 'UTC', '2030-01-01 00:30Z', 1)
    || pg_temp.slots('@annually', 'UTC', '2030-01-01 00:30Z', 1),
    ARRAY[
        '2030-01-01 01:00', '2030-01-02 00:00', '2030-01-02 00:00', '2030-01-06 00:00', '2030-02-01 00:00',
        '2031-01-01 00:00', '2031-01-01 00:00'
    ],
    '@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually'
);

-- Time zones and daylight saving. New York springs forward on 2030-03-10
-- (02:00 EST -> 03:00 EDT) and falls back on 2030-11-03 (02:00 EDT -> 01:00
-- EST); Berlin on 2030-03-31 (02:00 CET -> 03:00 CEST) and 2030-10-27
-- (03:00 CEST -> 02:00 CET).
SELECT is(
    pg_temp.slots('0 9 * * *', 'America/New_York', '2030-01-01Z', 1)
    || pg_temp.slots('0 9 * * *', 'America/New_York', '2030-07-01Z', 1),
    ARRAY['2030-01-01 14:00', '2030-07-01 13:00'],
    'slots are local times: 09:00 New York is 14:00 UTC in winter, 13:00 in summer'
);
SELECT is(pg_temp.slots(c.cron, c.time_zone, c.after::timestamptz, c.n), c.expected, c.description)
FROM (
    VALUES
    (
        '30 2 * * *', 'America/New_York', '2030-03-09 12:00Z', 2,
        'New York spring gap: 02:30 runs at the first instant after the gap, 03:00 EDT, and at 02:30 the next day',
        ARRAY['2030-03-10 07:00', '2030-03-11 06:30']
    ),
    (
        '*/30 * * * *', 'America/New_York', '2030-03-10 05:45Z', 5, 'New York spring gap: 02:00, 02:30 and 03:00 are one slot, 03:00 EDT',
        ARRAY['2030-03-10 06:00', '2030-03-10 06:30', '2030-03-10 07:00', '2030-03-10 07:30', '2030-03-10 08:00']
    ),
    (
        '30 1 * * *', 'America/New_York', '2030-11-02 12:00Z', 2,
        'New York fall back: 01:30 happens twice and runs once, at its first occurrence (EDT)',
        ARRAY['2030-11-03 05:30', '2030-11-04 06:30']
    ),
    (
        '*/30 * * * *', 'America/New_York', '2030-11-03 04:45Z', 5, 'New York fall back: the repeated hour has no slots of its own',
        ARRAY['2030-11-03 05:00', '2030-11-03 05:30', '2030-11-03 07:00', '2030-11-03 07:30', '2030-11-03 08:00']
    ),
    (
        '*/30 * * * *', 'America/New_York', '2030-11-03 06:10Z', 1, 'from inside the repeated hour, the next slot is after it',
        ARRAY['2030-11-03 07:00']
    ),
    (
        '30 2 * * *', 'Europe/Berlin', '2030-03-30 12:00Z', 2, 'Berlin spring gap: 02:30 runs at 03:00 CEST',
        ARRAY['2030-03-31 01:00', '2030-04-01 00:30']
    ),
    (
        '30 2 * * *', 'Europe/Berlin', '2030-10-26 12:00Z', 2, 'Berlin fall back: 02:30 runs once, at 02:30 CEST',
        ARRAY['2030-10-27 00:30', '2030-10-28 01:30']
    ),
    (
        '0 * * * *', 'Europe/Berlin', '2030-10-26 23:30Z', 4, 'Berlin fall back, hourly: 02:00 once (CEST), then 03:00 CET',
        ARRAY['2030-10-27 00:00', '2030-10-27 02:00', '2030-10-27 03:00', '2030-10-27 04:00']
    )
) AS c (cron, time_zone, after, n, description, expected);

-- The latest slot at or before now (missed skip).
SELECT is(
    runrelay._cron_latest(
        runrelay._cron_parse('*/5 * * * *'), 'UTC', '2030-01-01 00:00Z', '2030-06-01 12:34:56Z'
    ),
    '2030-06-01 12:30Z'::timestamptz,
    '_cron_latest: the latest slot at or before now'
);
SELECT is(
    runrelay._cron_latest(
        runrelay._cron_parse('*/30 * * * *'), 'America/New_York', '2030-11-03 04:00Z', '2030-11-03 06:45Z'
    ),
    '2030-11-03 05:30Z'::timestamptz,
    '_cron_latest inside the repeated hour: the first 01:30'
);
SELECT is(
    runrelay._cron_latest(
        runrelay._cron_parse('0 0 29 2 *'), 'UTC', '2000-02-29Z', '2099-03-01Z'
    ),
    '2096-02-29 00:00Z'::timestamptz,
    '_cron_latest a century on'
);

-- Malformed expressions: 22023 naming the field.
SELECT throws_ok(c.call, '22023', 'runrelay: invalid cron: ' || c.error, c.description)
FROM (
    VALUES
    ($$SELECT runrelay._cron_parse('60 * * * *')$$, 'minute field "60": 60 is out of range 0-59', 'minute out of range'),
    ($$SELECT runrelay._cron_parse('* * 0 * *')$$, 'day-of-month field "0": 0 is out of range 1-31', 'day-of-month out of range'),
    ($$SELECT runrelay._cron_parse('* * * 13 *')$$, 'month field "13": 13 is out of range 1-12', 'month out of range'),
    ($$SELECT runrelay._cron_parse('* * * * 8')$$, 'day-of-week field "8": 8 is out of range 0-7', 'day-of-week out of range'),
    ($$SELECT runrelay._cron_parse('* * * mon *')$$, 'month field "mon": "mon" is not a number or name', 'a weekday name as a month'),
    ($$SELECT runrelay._cron_parse('* x * * *')$$, 'hour field "x": "x" is not a number', 'letters in a field without names'),
    ($$SELECT runrelay._cron_parse('1,,2 * * * *')$$, 'minute field "1,,2": a value is missing', 'an empty list item'),
    ($$SELECT runrelay._cron_parse('*/0 * * * *')$$, 'minute field "*/0": the step must be a positive integer', 'a zero step'),
    ($$SELECT runrelay._cron_parse('5-1 * * * *')$$, 'minute field "5-1": the range runs backwards', 'a backwards range'),
    ($$SELECT runrelay._cron_parse('1-2-3 * * * *')$$, 'minute field "1-2-3": a range has two ends', 'a range with three ends'),
    ($$SELECT runrelay._cron_parse('0 0 30 2 *')$$, 'day-of-month field "30" never falls in month field "2"', 'a date that never comes')
) AS c (call, error, description);
SELECT lives_ok(
    $$SELECT runrelay._cron_parse('0 0 30 2 mon')$$,
    'the 30th of February or a Monday: Mondays come'
);
SELECT throws_ok(
    $$SELECT runrelay._cron_parse('@often')$$, '22023',
    'runrelay: invalid cron: must have five fields, minute hour day-of-month month day-of-week (got 1)',
    'an unknown macro'
);

-- The stepper, both ways, on local times: the nearest matching minute at or
-- after a time, and at or before it, across an hour, a day, a month and a
-- year; at a matching minute it stays.
CREATE FUNCTION pg_temp.steps(p_cron text, p_local timestamp)
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT ARRAY[
        to_char(runrelay._cron_step_local(runrelay._cron_parse(p_cron), p_local, TRUE), 'YYYY-MM-DD HH24:MI'),
        to_char(runrelay._cron_step_local(runrelay._cron_parse(p_cron), p_local, FALSE), 'YYYY-MM-DD HH24:MI')
    ]
$$;

SELECT is(
    pg_temp.steps('30 9 * * *', '2030-03-10 12:00'),
    ARRAY['2030-03-11 09:30', '2030-03-10 09:30'],
    'a daily minute: the next day''s, and the same day''s earlier'
);
SELECT is(
    pg_temp.steps('*/15 * * * *', '2030-03-10 10:07:42'),
    ARRAY['2030-03-10 10:15', '2030-03-10 10:00'],
    'every fifteen minutes: within the hour both ways'
);
SELECT is(
    pg_temp.steps('50 23 * * *', '2030-01-01 00:05'),
    ARRAY['2030-01-01 23:50', '2029-12-31 23:50'],
    'the last hour of the day: back across the year'
);
SELECT is(
    pg_temp.steps('0 0 1 2 *', '2030-02-01 00:00'),
    ARRAY['2030-02-01 00:00', '2030-02-01 00:00'],
    'a matching minute is its own nearest, both ways'
);

SELECT * FROM finish();
ROLLBACK;
