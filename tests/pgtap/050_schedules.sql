-- Schedules (docs/operations.md, "Periodic runs"): upsert_schedule answers
-- created, updated, unchanged; delete_schedule deleted, not_found;
-- list_schedules pages; enqueue_due_schedules enqueues each due slot once,
-- as a run named by the schedule and the slot, catching up or skipping
-- missed slots, never going back when the clock does; schedules_next_due_at;
-- every bad argument is 22023 with nothing changed; grants.
BEGIN;
SELECT plan(75);

SELECT tests.clear_runs();
DELETE FROM runrelay.schedules;

-- The database clock at p_at (the test clock: an offset from now).
CREATE FUNCTION pg_temp.at(p_at timestamptz)
RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('runrelay.clock_offset', (p_at - statement_timestamp())::text, TRUE);
$$;

-- (slot, run_id, created) of one enqueue_due_schedules call, as text rows.
CREATE FUNCTION pg_temp.due(p_max integer DEFAULT 100)
RETURNS SETOF text
LANGUAGE sql
AS $$
    SELECT format('%s %s %s', e.schedule, e.run_id, e.created::text)
    FROM runrelay.enqueue_due_schedules(p_max) AS e;
$$;

CREATE FUNCTION pg_temp.next_slot(p_name text)
RETURNS timestamptz
LANGUAGE sql
AS $$
    SELECT s.next_slot_at FROM runrelay.list_schedules() AS s WHERE s.name = p_name;
$$;

CREATE FUNCTION pg_temp.schedules_digest()
RETURNS text
LANGUAGE sql
AS $$
    SELECT md5(coalesce(string_agg(s::text, ',' ORDER BY s.name), '')) FROM runrelay.schedules AS s;
$$;

-- Declaring: created, unchanged, updated.
SELECT pg_temp.at('2030-03-30 12:00:30Z');
SELECT is(
    runrelay.upsert_schedule(
        'nightly', '0 2 * * *', 'Europe/Berlin', 'reports', '{"kind": "nightly"}', missed => 'catch_up'
    ),
    'created', 'upsert_schedule: created'
);
-- 2030-03-31 is Berlin's spring forward: 02:00 does not exist that night.
SELECT is(
    pg_temp.next_slot('nightly'), '2030-03-31 01:00Z'::timestamptz,
    'the first slot is the first after now; a local time in the DST gap is the first instant after it (03:00 CEST)'
);
SELECT results_eq(
    $$SELECT cron, time_zone, queue, payload, priority, max_attempts, concurrency_key, missed, enabled, last_slot_at
      FROM runrelay.list_schedules()$$,
    $$VALUES ('0 2 * * *', 'Europe/Berlin', 'reports', '{"kind": "nightly"}'::jsonb, 0, 3, NULL::text, 'catch_up',
              TRUE, NULL::timestamptz)$$,
    'list_schedules: the declaration, nothing enqueued yet'
);
SELECT is(
    runrelay.upsert_schedule(
        'nightly', ' 0  2 * * * ', 'europe/berlin', 'reports', '{"kind": "nightly"}', missed => 'catch_up'
    ),
    'unchanged', 'the same declaration (blanks and the time zone''s letter case aside): unchanged'
);
SELECT is(
    (
        SELECT s.updated_at = s.created_at FROM runrelay.schedules AS s
        WHERE s.name = 'nightly'
    ), TRUE,
    'unchanged writes nothing'
);
SELECT is(
    runrelay.upsert_schedule(
        'nightly', '0 2 * * *', 'Europe/Berlin', 'reports', '{"kind": "nightly", "v": 2}', priority => 5,
        max_attempts => 1, missed => 'catch_up'
    ),
    'updated', 'another payload, priority and max_attempts: updated'
);
SELECT is(pg_temp.next_slot('nightly'), '2030-03-31 01:00Z'::timestamptz, 'an update of the arguments keeps the next slot');

-- Enqueueing the due slots.
SELECT is_empty($$SELECT pg_temp.due()$$, 'nothing is due before the first slot');
SELECT pg_temp.at('2030-03-31 01:00:30Z');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due()$$,
    $$VALUES ('nightly schedule:nightly:2030-03-31T01:00:00Z true')$$,
    'enqueue_due_schedules: the due slot, named by schedule and slot, created'
);
SELECT results_eq(
    $$SELECT queue, status, payload, priority, max_attempts, run_at FROM runrelay.runs$$,
    $$VALUES ('reports', 'queued', '{"kind": "nightly", "v": 2}'::jsonb, 5, 1, '2030-03-31 01:00Z'::timestamptz)$$,
    'the run has the schedule''s arguments and run_at at its slot'
);
SELECT is(
    tests.lifecycle('schedule:nightly:2030-03-31T01:00:00Z'), ARRAY['run.queued'],
    'the run is enqueued as any run is: run.queued'
);
SELECT is_empty($$SELECT pg_temp.due()$$, 'called again: nothing is due');
SELECT results_eq(
    $$SELECT next_slot_at, last_slot_at FROM runrelay.list_schedules()$$,
    $$VALUES ('2030-04-01 00:00Z'::timestamptz, '2030-03-31 01:00Z'::timestamptz)$$,
    'the schedule moved past its slot: the next is 02:00 CEST'
);

-- catch_up: every missed slot, at most max_runs a call.
SELECT pg_temp.at('2030-04-03 12:00:30Z');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due(2)$$,
    $$VALUES ('nightly schedule:nightly:2030-04-01T00:00:00Z true'),
             ('nightly schedule:nightly:2030-04-02T00:00:00Z true')$$,
    'catch_up after downtime: missed slots in order, max_runs of them'
);
SELECT is(pg_temp.next_slot('nightly'), '2030-04-03 00:00Z'::timestamptz, 'the rest stay due');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due(2)$$,
    $$VALUES ('nightly schedule:nightly:2030-04-03T00:00:00Z true')$$,
    'the next call enqueues the rest'
);

-- skip: only the latest missed slot.
SELECT is(
    runrelay.upsert_schedule('hourly', '0 * * * *', queue => 'ticks', missed => 'skip'), 'created',
    'a skip schedule'
);
SELECT is(pg_temp.next_slot('hourly'), '2030-04-03 13:00Z'::timestamptz, 'its first slot');
SELECT pg_temp.at('2030-04-03 17:20:30Z');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due()$$,
    $$VALUES ('hourly schedule:hourly:2030-04-03T17:00:00Z true')$$,
    'skip after downtime: the latest missed slot alone'
);
SELECT is(pg_temp.next_slot('hourly'), '2030-04-03 18:00Z'::timestamptz, 'then the next slot');

-- A clock set back enqueues nothing until it passes the next slot again.
SELECT pg_temp.at('2030-04-01 00:00:30Z');
SELECT is_empty($$SELECT pg_temp.due()$$, 'a clock set back re-enqueues no old slot');
SELECT is(pg_temp.next_slot('hourly'), '2030-04-03 18:00Z'::timestamptz, 'and the schedule stays where it was');

-- A slot whose run exists is answered as it is, whatever its queue and
-- payload: a replay of a slot (its state lost), or a run written before
-- producers were refused schedule: run ids (inserted directly here).
SELECT pg_temp.at('2030-04-03 18:00:30Z');
SELECT tests.insert_run('schedule:hourly:2030-04-03T18:00:00Z');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due()$$,
    $$VALUES ('hourly schedule:hourly:2030-04-03T18:00:00Z false')$$,
    'a slot whose run exists: created false, no conflict'
);
UPDATE runrelay.schedules AS s SET next_slot_at = '2030-04-03 17:00Z', last_slot_at = NULL
WHERE s.name = 'hourly';
SELECT results_eq(
    $$SELECT * FROM pg_temp.due()$$,
    $$VALUES ('hourly schedule:hourly:2030-04-03T18:00:00Z false')$$,
    'a slot replayed (its state set back) is the same run: created false'
);
SELECT is(
    (
        SELECT count(*)::integer FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'schedule:hourly:%'
    ), 2,
    'no run was enqueued twice'
);

-- A new cron expression starts after now and after the latest slot.
SELECT is(
    runrelay.upsert_schedule('hourly', '30 * * * *', queue => 'ticks', missed => 'skip'), 'updated',
    'a new expression: updated'
);
SELECT is(pg_temp.next_slot('hourly'), '2030-04-03 18:30Z'::timestamptz, 'its next slot is after now');
SELECT pg_temp.at('2030-04-03 17:00:30Z');
SELECT is(
    runrelay.upsert_schedule('hourly', '15 * * * *', queue => 'ticks', missed => 'skip'), 'updated',
    'changed again while the clock is set back'
);
SELECT is(
    pg_temp.next_slot('hourly'), '2030-04-03 18:15Z'::timestamptz,
    'its next slot is after the latest slot enqueued, not after the clock'
);

-- Disabled: nothing is enqueued; enabled again, it starts after now.
SELECT is(
    runrelay.upsert_schedule('hourly', '15 * * * *', queue => 'ticks', missed => 'skip', enabled => FALSE), 'updated',
    'disabled: updated'
);
SELECT is(pg_temp.next_slot('hourly'), NULL, 'a disabled schedule has no next slot');
SELECT pg_temp.at('2030-04-03 21:00:30Z');
SELECT is_empty(
    $$SELECT * FROM runrelay.enqueue_due_schedules() AS e WHERE e.schedule = 'hourly'$$,
    'a disabled schedule is never due'
);
SELECT is(
    runrelay.upsert_schedule('hourly', '15 * * * *', queue => 'ticks', missed => 'skip'), 'updated',
    'enabled again: updated'
);
SELECT is(
    pg_temp.next_slot('hourly'), '2030-04-03 21:15Z'::timestamptz,
    'enabled again, it starts after now: the slots of its pause are not enqueued'
);

-- The runs' arguments: concurrency_key, and a max_runs smaller than a
-- catch-up across two schedules.
DELETE FROM runrelay.schedules;
SELECT tests.clear_runs();
SELECT pg_temp.at('2030-05-01 10:00:30Z');
SELECT runrelay.upsert_schedule('a', '*/10 * * * *', missed => 'catch_up', concurrency_key => 'k');
SELECT runrelay.upsert_schedule('b', '*/20 * * * *', missed => 'catch_up');
SELECT pg_temp.at('2030-05-01 11:00:30Z');
SELECT results_eq(
    $$SELECT * FROM pg_temp.due(7)$$,
    $$VALUES ('a schedule:a:2030-05-01T10:10:00Z true'), ('a schedule:a:2030-05-01T10:20:00Z true'),
             ('a schedule:a:2030-05-01T10:30:00Z true'), ('a schedule:a:2030-05-01T10:40:00Z true'),
             ('a schedule:a:2030-05-01T10:50:00Z true'), ('a schedule:a:2030-05-01T11:00:00Z true'),
             ('b schedule:b:2030-05-01T10:20:00Z true')$$,
    'max_runs counts slots across schedules, earliest next slot first'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.due(7)$$,
    $$VALUES ('b schedule:b:2030-05-01T10:40:00Z true'), ('b schedule:b:2030-05-01T11:00:00Z true')$$,
    'the next call goes on where it stopped'
);
SELECT is(
    (
        SELECT array_agg(r.key_held ORDER BY r.run_at) FROM runrelay.runs AS r
        WHERE r.concurrency_key = 'k'
    ),
    ARRAY[FALSE, TRUE, TRUE, TRUE, TRUE, TRUE],
    'a schedule''s concurrency_key makes its runs serial, in slot order'
);

-- schedules_next_due_at.
SELECT results_eq(
    $$SELECT next_slot_at, due_in_ms BETWEEN 9 * 60000 AND 9 * 60000 + 30000 FROM runrelay.schedules_next_due_at()$$,
    $$VALUES ('2030-05-01 11:10Z'::timestamptz, TRUE)$$,
    'schedules_next_due_at: the earliest next slot, and the milliseconds to it by the database clock'
);
SELECT pg_temp.at('2030-05-01 11:30:30Z');
SELECT results_eq(
    $$SELECT next_slot_at, due_in_ms FROM runrelay.schedules_next_due_at()$$,
    $$VALUES ('2030-05-01 11:10Z'::timestamptz, 0::bigint)$$,
    'a slot due now is due in 0 ms'
);
SELECT runrelay.upsert_schedule('a', '*/10 * * * *', missed => 'catch_up', concurrency_key => 'k', enabled => FALSE);
SELECT runrelay.upsert_schedule('b', '*/20 * * * *', missed => 'catch_up', enabled => FALSE);
SELECT results_eq(
    $$SELECT next_slot_at, due_in_ms FROM runrelay.schedules_next_due_at()$$,
    $$VALUES (NULL::timestamptz, NULL::bigint)$$,
    'no enabled schedule: nulls'
);

-- list_schedules pages by name.
SELECT results_eq(
    $$SELECT name FROM runrelay.list_schedules(max_rows => 1)$$, $$VALUES ('a')$$, 'list_schedules: a page'
);
SELECT results_eq(
    $$SELECT name FROM runrelay.list_schedules(after_name => 'a')$$, $$VALUES ('b')$$,
    'list_schedules: the next page'
);

-- Deleting.
SELECT is(runrelay.delete_schedule('a'), 'deleted', 'delete_schedule: deleted');
SELECT is(runrelay.delete_schedule('a'), 'not_found', 'delete_schedule again: not_found');
SELECT is(
    (
        SELECT count(*)::integer FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'schedule:a:%'
    ), 6,
    'the runs a deleted schedule enqueued stay'
);

-- Bad input: 22023, nothing changed.
CREATE TEMP TABLE before_bad AS SELECT pg_temp.schedules_digest() AS digest;
SELECT throws_ok($$SELECT runrelay.upsert_schedule(NULL, '* * * * *')$$, '22023', NULL, 'name null');
SELECT throws_ok($$SELECT runrelay.upsert_schedule(' ', '* * * * *')$$, '22023', NULL, 'name blank');
SELECT throws_ok(
    format('SELECT runrelay.upsert_schedule(%L, %L)', repeat('n', 161), '* * * * *'), '22023',
    'runrelay: invalid name: must be at most 160 characters (got 161)', 'name longer than 160 characters'
);
SELECT throws_ok($$SELECT runrelay.upsert_schedule('b', NULL)$$, '22023', NULL, 'cron null');
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '* * * *')$$, '22023',
    'runrelay: invalid cron: must have five fields, minute hour day-of-month month day-of-week (got 4)',
    'cron with four fields'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '* 24 * * *')$$, '22023',
    'runrelay: invalid cron: hour field "24": 24 is out of range 0-23', 'cron out of range, naming the field'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', time_zone => 'Mars/Olympus_Mons')$$, '22023',
    'runrelay: invalid time_zone: unknown time zone "Mars/Olympus_Mons"', 'an unknown time zone'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', time_zone => '+05')$$, '22023', NULL,
    'a UTC offset is not a time zone name'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', time_zone => NULL)$$, '22023', NULL, 'time_zone null'
);
SELECT throws_ok($$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', queue => '')$$, '22023', NULL, 'queue empty');
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', payload => NULL)$$, '22023', NULL, 'payload null'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', priority => 1000001)$$, '22023', NULL,
    'priority out of range'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', max_attempts => 0)$$, '22023', NULL,
    'max_attempts out of range'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', concurrency_key => ' ')$$, '22023', NULL,
    'concurrency_key blank'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', missed => 'sometimes')$$, '22023',
    'runrelay: invalid missed: must be catch_up or skip (got "sometimes")', 'missed unknown'
);
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('b', '*/20 * * * *', enabled => NULL)$$, '22023', NULL, 'enabled null'
);
SELECT throws_ok($$SELECT runrelay.delete_schedule(NULL)$$, '22023', NULL, 'delete_schedule: name null');
SELECT throws_ok($$SELECT * FROM runrelay.list_schedules(max_rows => 0)$$, '22023', NULL, 'list_schedules: max_rows 0');
SELECT throws_ok(
    $$SELECT * FROM runrelay.list_schedules(after_name => '')$$, '22023', NULL, 'list_schedules: after_name empty'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_due_schedules(0)$$, '22023', NULL, 'enqueue_due_schedules: max_runs 0'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_due_schedules(10001)$$, '22023', NULL,
    'enqueue_due_schedules: max_runs above 10000'
);
SELECT is(pg_temp.schedules_digest(), (SELECT b.digest FROM before_bad AS b), 'no bad call changed a schedule');

-- Grants: declaring is the admin's; the maintenance calls are the worker's
-- and the admin's.
SELECT
    function_privs_are(
        'runrelay', 'enqueue_due_schedules', ARRAY['integer'], r.role,
        CASE WHEN r.role IN ('runrelay_worker', 'runrelay_admin') THEN ARRAY['EXECUTE'] ELSE ARRAY[]::text[] END,
        'enqueue_due_schedules: EXECUTE for ' || r.role
    )
FROM (VALUES ('runrelay_producer'), ('runrelay_worker'), ('runrelay_relay'), ('runrelay_admin')) AS r (role)
ORDER BY r.role;
SELECT
    function_privs_are(
        'runrelay', 'schedules_next_due_at', ARRAY[]::text[], r.role,
        CASE WHEN r.role IN ('runrelay_worker', 'runrelay_admin') THEN ARRAY['EXECUTE'] ELSE ARRAY[]::text[] END,
        'schedules_next_due_at: EXECUTE for ' || r.role
    )
FROM (VALUES ('runrelay_producer'), ('runrelay_worker'), ('runrelay_relay'), ('runrelay_admin')) AS r (role)
ORDER BY r.role;

SELECT * FROM finish();
ROLLBACK;
