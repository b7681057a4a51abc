-- The overview (docs/admin.md, "The overview"): queue_overview counts each
-- queue's runs by state and its runs ended completed / failed per minute
-- over the last hour; ledger_overview the lanes waiting for delivery;
-- record_queue_activity finalizes minutes into the rollup behind a 2-minute
-- grace, moves its watermark, answers 0 when another caller holds it, and
-- forgets rows older than a day. A minute reads the same whether it comes
-- from the rollup or from the ledger. Everything on the test clock.
BEGIN;
SELECT plan(50);

SELECT tests.clear_runs();
DELETE FROM runrelay.paused_queues;
DELETE FROM runrelay.queue_activity;
DELETE FROM runrelay.queue_activity_watermark;

-- The database clock at p_at (the test clock: an offset from now).
CREATE FUNCTION pg_temp.at(p_at timestamptz)
RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('runrelay.clock_offset', (p_at - statement_timestamp())::text, TRUE);
$$;

-- A run of its queue that ends at once: completed or failed (one attempt).
CREATE FUNCTION pg_temp.ended(p_run_id text, p_queue text, p_outcome text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_claim record;
BEGIN
    PERFORM runrelay.enqueue_run(p_run_id, p_queue, max_attempts => 1, priority => 100);
    SELECT c.* INTO v_claim FROM runrelay.claim_attempts('w', ARRAY[p_queue]) AS c;
    IF v_claim.run_id IS DISTINCT FROM p_run_id THEN
        RAISE EXCEPTION 'pg_temp.ended: claimed % instead of %', v_claim.run_id, p_run_id;
    END IF;
    IF p_outcome = 'completed' THEN
        RETURN runrelay.complete_attempt(v_claim.run_id, v_claim.attempt, v_claim.lease_token);
    END IF;
    RETURN runrelay.fail_attempt(v_claim.run_id, v_claim.attempt, v_claim.lease_token, '{"e": 1}');
END;
$$;

-- A run of its queue, claimed and left running.
CREATE FUNCTION pg_temp.running(p_run_id text, p_queue text)
RETURNS tests.claim
LANGUAGE plpgsql
AS $$
DECLARE
    v_claim tests.claim;
BEGIN
    PERFORM runrelay.enqueue_run(p_run_id, p_queue, priority => 100);
    SELECT c.run_id, c.attempt, c.lease_token INTO v_claim
    FROM runrelay.claim_attempts('w', ARRAY[p_queue]) AS c;
    IF v_claim.run_id IS DISTINCT FROM p_run_id THEN
        RAISE EXCEPTION 'pg_temp.running: claimed % instead of %', v_claim.run_id, p_run_id;
    END IF;
    RETURN v_claim;
END;
$$;

-- The non-zero entries of a per-minute array as 'index:count', in order.
CREATE FUNCTION pg_temp.nonzero(p_counts integer[])
RETURNS text
LANGUAGE sql
AS $$
    SELECT coalesce(string_agg(c.i || ':' || c.n, ',' ORDER BY c.i), '')
    FROM unnest(p_counts) WITH ORDINALITY AS c (n, i)
    WHERE c.n <> 0;
$$;

-- Each queue's per-minute arrays in that notation.
CREATE FUNCTION pg_temp.minutes()
RETURNS TABLE (queue text, completed text, failed text)
LANGUAGE sql
AS $$
    SELECT o.queue, pg_temp.nonzero(o.completed_per_minute), pg_temp.nonzero(o.failed_per_minute)
    FROM runrelay.queue_overview() AS o;
$$;

-- Deliver a run's lifecycle lane to the end (claim the head, ack it, again).
CREATE FUNCTION pg_temp.deliver(p_run_id text)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids bigint[];
    v_done integer := 0;
BEGIN
    LOOP
        SELECT array_agg(c.event_id) INTO v_ids FROM runrelay.claim_ledger('r0', run_id => p_run_id) AS c;
        EXIT WHEN v_ids IS NULL;
        PERFORM runrelay.ack_ledger('r0', p_run_id, v_ids);
        v_done := v_done + cardinality(v_ids);
    END LOOP;
    RETURN v_done;
END;
$$;

-- Hold the rollup's lock (the watermark row) from a second session, as a
-- concurrent record_queue_activity would; pg_temp.release_rollup() ends that
-- session. There is no watermark yet: the holder commits one (this
-- transaction could not see it otherwise) and deletes it on release.
CREATE FUNCTION pg_temp.hold_rollup()
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM dblink_connect('ov_holder', format(
        'dbname=%s port=%s host=%s user=%s',
        current_database(),
        current_setting('port'),
        coalesce(host(inet_server_addr()), split_part(current_setting('unix_socket_directories'), ',', 1)),
        current_user
    ));
    PERFORM dblink_exec('ov_holder', $q$SET lock_timeout = '1s'$q$);
    PERFORM dblink_exec('ov_holder', $q$INSERT INTO runrelay.queue_activity_watermark (final_before, updated_at)
        VALUES (date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00'), now())$q$);
    PERFORM dblink_exec('ov_holder', 'BEGIN');
    PERFORM * FROM dblink('ov_holder', 'SELECT 1 FROM runrelay.queue_activity_watermark FOR UPDATE NOWAIT')
        AS t (held integer);
    RETURN TRUE;
END;
$$;

CREATE FUNCTION pg_temp.release_rollup()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM dblink_exec('ov_holder', 'DELETE FROM runrelay.queue_activity_watermark');
    PERFORM dblink_exec('ov_holder', 'COMMIT');
    PERFORM dblink_disconnect('ov_holder');
END;
$$;

-- The timeline. Now is B = 2030-06-01 12:00:10Z: the window is the minutes
-- 11:01 .. 12:00, indexes 1 .. 60 (11:10 is 10, 11:50 is 50, 11:59 is 59).
-- run_at is given where it matters: its default is the real now().
SELECT pg_temp.at('2030-06-01 11:10:10Z');
SELECT pg_temp.ended('h-a1', 'ov-a', 'completed');
SELECT pg_temp.ended('h-a2', 'ov-a', 'completed');
SELECT pg_temp.ended('h-b1', 'ov-b', 'failed');
SELECT pg_temp.at('2030-06-01 11:50:10Z');
SELECT pg_temp.ended('h-a3', 'ov-a', 'completed');
SELECT pg_temp.ended('h-a4', 'ov-a', 'failed');
SELECT pg_temp.at('2030-06-01 11:55:10Z');
SELECT runrelay.enqueue_run('q-old', 'ov-a', run_at => '2030-06-01 11:55:10Z');
SELECT pg_temp.at('2030-06-01 11:59:10Z');
SELECT pg_temp.ended('h-b2', 'ov-b', 'completed');
SELECT pg_temp.at('2030-06-01 12:00:10Z');
SELECT pg_temp.ended('h-a5', 'ov-a', 'completed');
SELECT runrelay.enqueue_run('q-later', 'ov-a', run_at => '2030-06-01 13:00:00Z');
SELECT runrelay.enqueue_run('k1', 'ov-a', run_at => '2030-06-01 12:00:10Z', concurrency_key => 'ov-key');
SELECT runrelay.enqueue_run('k2', 'ov-a', run_at => '2030-06-01 12:00:10Z', concurrency_key => 'ov-key');
SELECT pg_temp.running('r-a', 'ov-a');
SELECT runrelay.suspend_attempt(c.run_id, c.attempt, c.lease_token, '{"kind": "event", "name": "go"}')
FROM pg_temp.running('w-b', 'ov-b') AS c;
SELECT pg_temp.running('r-r', 'ov-r');
SELECT runrelay.pause_queue('ov-p');

-- queue_overview: the backlog.
SELECT results_eq(
    $$SELECT queue, paused, queued, scheduled, held_by_key, running, waiting,
             completed_last_hour, failed_last_hour
      FROM runrelay.queue_overview()$$,
    $$VALUES ('ov-a', FALSE, 2::bigint, 1::bigint, 1::bigint, 1::bigint, 0::bigint, 4::bigint, 1::bigint),
             ('ov-b', FALSE, 0, 0, 0, 0, 1, 1, 1),
             ('ov-p', TRUE, 0, 0, 0, 0, 0, 0, 0),
             ('ov-r', FALSE, 0, 0, 0, 1, 0, 0, 0)$$,
    'one row per queue with runs (ov-r''s only run is running) and the paused empty one; '
    || 'queued (due, not held), scheduled, held by its key, running, waiting'
);
SELECT ok(
    (
        SELECT o.oldest_runnable_age_seconds BETWEEN 300 AND 310 FROM runrelay.queue_overview() AS o
        WHERE o.queue = 'ov-a'
    ),
    'oldest_runnable_age_seconds: the oldest due run (q-old, due 5 minutes ago), not the later one'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.queue_overview() AS o
        WHERE o.oldest_runnable_age_seconds IS NULL
    ),
    3::bigint,
    'oldest_runnable_age_seconds is null for a queue with nothing runnable'
);
SELECT is(
    (
        SELECT array_agg(DISTINCT cardinality(x.a))
        FROM runrelay.queue_overview() AS o
        CROSS JOIN LATERAL (VALUES (o.completed_per_minute), (o.failed_per_minute)) AS x (a)
    ),
    ARRAY[60],
    'every per-minute array has 60 entries'
);
SELECT results_eq(
    $$SELECT queue, completed, failed FROM pg_temp.minutes()$$,
    $$VALUES ('ov-a', '10:2,50:1,60:1', '50:1'), ('ov-b', '59:1', '10:1'), ('ov-p', '', ''), ('ov-r', '', '')$$,
    'per minute, oldest first: the last entry is the current minute (h-a5, ten seconds ago)'
);
SELECT is(
    (SELECT count(*) FROM runrelay.queue_activity),
    0::bigint,
    'read from the ledger alone: queue_overview writes no rollup'
);

-- ledger_overview: every run's lifecycle lane is undelivered; no
-- observability event yet. The oldest head is h-a1's run.queued, 50 minutes old.
SELECT results_eq(
    $$SELECT lane, pending_lanes, leased_lanes, blocked_heads FROM runrelay.ledger_overview()$$,
    $$VALUES ('lifecycle', 14::bigint, 0::bigint, 0::bigint), ('observability', 0, 0, 0)$$,
    'ledger_overview: one row per lane kind, the idle one with zeros'
);
SELECT ok(
    (
        SELECT o.oldest_pending_age_seconds BETWEEN 3000 AND 3010 FROM runrelay.ledger_overview() AS o
        WHERE o.lane = 'lifecycle'
    ),
    'the delivery lag: the oldest undelivered head''s age'
);
SELECT is(
    (
        SELECT o.oldest_pending_age_seconds FROM runrelay.ledger_overview() AS o
        WHERE o.lane = 'observability'
    ),
    NULL,
    'no undelivered head: no lag'
);
SELECT is(
    pg_temp.deliver('h-a1') + pg_temp.deliver('h-a2') + pg_temp.deliver('h-b1'),
    9,
    'the three runs of 11:10 delivered (queued, started, ended each)'
);
SELECT is(
    (SELECT count(*) FROM runrelay.claim_ledger('r1', run_id => 'h-a3')),
    1::bigint,
    'h-a3''s head leased'
);
SELECT is(
    (
        SELECT array_agg(f.outcome)
        FROM runrelay.fail_ledger(
            'r2', array(SELECT c.event_id FROM runrelay.claim_ledger('r2', run_id => 'h-a4') AS c), '{"http": 500}',
            permanent => TRUE
        ) AS f
    ),
    ARRAY['blocked'],
    'h-a4''s head blocked'
);
SELECT runrelay.append_events('q-old', '[{"type": "log", "lane": "observability"}]');
SELECT results_eq(
    $$SELECT lane, pending_lanes, leased_lanes, blocked_heads FROM runrelay.ledger_overview()$$,
    $$VALUES ('lifecycle', 11::bigint, 1::bigint, 1::bigint), ('observability', 1, 0, 0)$$,
    'delivered lanes leave the count; a leased and a blocked lane are still pending'
);
SELECT ok(
    (
        SELECT o.oldest_pending_age_seconds BETWEEN 600 AND 610 FROM runrelay.ledger_overview() AS o
        WHERE o.lane = 'lifecycle'
    ),
    'the lag is now h-a3''s head (leased, undelivered), of 11:50'
);
SELECT ok(
    (
        SELECT o.oldest_pending_age_seconds BETWEEN 0 AND 10 FROM runrelay.ledger_overview() AS o
        WHERE o.lane = 'observability'
    ),
    'the observability lane''s lag: its one event, just appended'
);
SELECT pg_temp.at('2030-06-01 12:10:10Z');
SELECT results_eq(
    $$SELECT lane, pending_lanes, leased_lanes, blocked_heads FROM runrelay.ledger_overview()$$,
    $$VALUES ('lifecycle', 11::bigint, 0::bigint, 1::bigint), ('observability', 1, 0, 0)$$,
    'a lapsed lease is pending, not leased'
);

-- A concurrent caller holds the rollup: the call answers 0 at once.
SELECT pg_temp.at('2030-06-01 12:00:10Z');
SELECT ok(pg_temp.hold_rollup(), 'a second session holds the rollup''s lock');
SET LOCAL lock_timeout = '1s';
SELECT is(runrelay.record_queue_activity(), 0, 'record_queue_activity: 0 without waiting while another caller holds it');
RESET lock_timeout;
SELECT pg_temp.release_rollup();
SELECT is((SELECT count(*) FROM runrelay.queue_activity_watermark), 0::bigint, 'no watermark yet');

-- Finalizing: the live figures, kept to compare.
CREATE TEMPORARY TABLE live ON COMMIT DROP AS SELECT * FROM pg_temp.minutes();
SELECT is(
    runrelay.record_queue_activity(),
    58,
    'first call: the hour up to the minute of now - 2 minutes, 11:00 .. 11:57'
);
SELECT is(
    (SELECT w.final_before FROM runrelay.queue_activity_watermark AS w),
    '2030-06-01 11:58:00Z'::timestamptz,
    'the watermark: every minute before 11:58 is final'
);
SELECT results_eq(
    $$SELECT minute, queue, completed, failed FROM runrelay.queue_activity ORDER BY minute, queue$$,
    $$VALUES ('2030-06-01 11:10Z'::timestamptz, 'ov-a', 2, 0),
             ('2030-06-01 11:10Z', 'ov-b', 0, 1),
             ('2030-06-01 11:50Z', 'ov-a', 1, 1)$$,
    'one row per (minute, queue) with activity; 11:59 and 12:00 are within the grace period'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.minutes()$$,
    $$SELECT * FROM live$$,
    'the same arrays from the rollup and the ledger''s tail as from the ledger alone'
);
SELECT is(runrelay.record_queue_activity(), 0, 'again in the same minute: nothing due');
SELECT pg_temp.at('2030-06-01 12:01:10Z');
SELECT is(runrelay.record_queue_activity(), 1, 'a minute on: one more minute final (11:58)');
SELECT pg_temp.at('2030-06-01 12:02:10Z');
SELECT is(runrelay.record_queue_activity(), 1, 'and the next (11:59)');
SELECT results_eq(
    $$SELECT minute, queue, completed, failed FROM runrelay.queue_activity WHERE minute > '2030-06-01 11:50Z'$$,
    $$VALUES ('2030-06-01 11:59Z'::timestamptz, 'ov-b', 1, 0)$$,
    'h-b2''s minute, final once two minutes past'
);
SELECT is(
    (SELECT w.final_before FROM runrelay.queue_activity_watermark AS w),
    '2030-06-01 12:00:00Z'::timestamptz,
    'the watermark moved with them'
);
SELECT results_eq(
    $$SELECT queue, completed, failed FROM pg_temp.minutes()$$,
    $$VALUES ('ov-a', '8:2,48:1,58:1', '48:1'), ('ov-b', '57:1', '8:1'), ('ov-p', '', ''), ('ov-r', '', '')$$,
    'two minutes on, the window moved by two: 11:10 is now index 8; 12:00 (h-a5) is counted from the ledger'
);
-- The finalized minutes are read from the rollup, not counted again.
UPDATE runrelay.queue_activity SET completed = completed + 100
WHERE minute = '2030-06-01 11:10Z' AND queue = 'ov-a';
SELECT is(
    (
        SELECT completed FROM pg_temp.minutes()
        WHERE queue = 'ov-a'
    ),
    '8:102,48:1,58:1',
    'a final minute comes from queue_activity'
);
SELECT is(
    (
        SELECT completed_last_hour FROM runrelay.queue_overview()
        WHERE queue = 'ov-a'
    ),
    104::bigint,
    'completed_last_hour is the sum of the array'
);
UPDATE runrelay.queue_activity SET completed = completed - 100
WHERE minute = '2030-06-01 11:10Z' AND queue = 'ov-a';
-- A run that ends now is in the current minute at once, from the ledger.
SELECT pg_temp.ended('h-a6', 'ov-a', 'completed');
SELECT is(
    (
        SELECT completed FROM pg_temp.minutes()
        WHERE queue = 'ov-a'
    ),
    '8:2,48:1,58:1,60:1',
    'the current minute counts as runs end'
);

-- A watermark older than the hour: the minutes between are never filled in.
SELECT pg_temp.at('2030-06-01 15:00:10Z');
SELECT results_eq(
    $$SELECT queue, completed, failed FROM pg_temp.minutes()$$,
    $$VALUES ('ov-a', '', ''), ('ov-b', '', ''), ('ov-p', '', ''), ('ov-r', '', '')$$,
    'three hours on, the last hour had no activity'
);
SELECT is(runrelay.record_queue_activity(), 58, 'a stale watermark: the call starts an hour back, not at it');
SELECT is(
    (SELECT w.final_before FROM runrelay.queue_activity_watermark AS w),
    '2030-06-01 14:58:00Z'::timestamptz,
    'the watermark jumped'
);
SELECT is(
    (SELECT count(*) FROM runrelay.queue_activity), 4::bigint,
    'rows of the last day are kept (12:00 .. 12:02, between the old watermark and 14:00, were never final)'
);
-- A day on, the rows older than a day go.
SELECT pg_temp.at('2030-06-02 12:05:10Z');
SELECT is(runrelay.record_queue_activity(), 58, 'a day on: the last hour again');
SELECT is((SELECT count(*) FROM runrelay.queue_activity), 0::bigint, 'rows older than a day are deleted');

-- Privileges: record_queue_activity is the maintenance loops' (worker)
-- and the operators' (admin); the overview is the admin's alone
-- (043_admin_security.sql).
SELECT is(
    (
        SELECT array_agg(DISTINCT a.grantee::regrole::text ORDER BY a.grantee::regrole::text)
        FROM pg_proc AS p CROSS JOIN LATERAL aclexplode(p.proacl) AS a
        WHERE
            p.oid = 'runrelay.record_queue_activity()'::regprocedure
            AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    ),
    ARRAY['runrelay_admin', 'runrelay_worker'],
    'record_queue_activity: EXECUTE for the worker and admin roles only'
);
SELECT ok(
    (
        SELECT p.prosecdef AND p.provolatile = 'v' AND obj_description(p.oid, 'pg_proc') IS NOT NULL
        FROM pg_proc AS p
        WHERE p.oid = 'runrelay.record_queue_activity()'::regprocedure
    ),
    'record_queue_activity is SECURITY DEFINER, VOLATILE, with a COMMENT'
);
SELECT table_privs_are('runrelay', 'queue_activity', 'runrelay_worker', ARRAY[]::text[], 'a worker cannot touch queue_activity');
SELECT table_privs_are(
    'runrelay', 'queue_activity_watermark', 'runrelay_worker', ARRAY[]::text[],
    'a worker cannot touch queue_activity_watermark'
);
SET LOCAL ROLE runrelay_worker;
SELECT lives_ok($$SELECT runrelay.record_queue_activity()$$, 'a worker calls record_queue_activity');
SELECT throws_ok($$SELECT * FROM runrelay.queue_overview()$$, '42501', NULL, 'a worker cannot call queue_overview');
SELECT throws_ok($$SELECT * FROM runrelay.ledger_overview()$$, '42501', NULL, 'a worker cannot call ledger_overview');
SELECT throws_ok($$SELECT * FROM runrelay.queue_activity$$, '42501', NULL, 'a worker cannot read the rollup');
RESET ROLE;
SET LOCAL ROLE runrelay_admin;
SELECT lives_ok($$SELECT runrelay.record_queue_activity()$$, 'an admin calls record_queue_activity');
SELECT throws_ok(
    $$UPDATE runrelay.queue_activity_watermark SET final_before = now()$$, '42501', NULL,
    'an admin cannot move the watermark by hand'
);
RESET ROLE;
SET LOCAL ROLE runrelay_producer;
SELECT throws_ok($$SELECT runrelay.record_queue_activity()$$, '42501', NULL, 'a producer cannot call record_queue_activity');
RESET ROLE;
SET LOCAL ROLE runrelay_relay;
SELECT throws_ok($$SELECT runrelay.record_queue_activity()$$, '42501', NULL, 'a relay cannot call record_queue_activity');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
