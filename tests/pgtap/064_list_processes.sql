-- list_processes (docs/admin.md): one row per worker or relay name seen in
-- the last hour or holding work now, derived from their own calls' writes:
-- kind, last seen, what it holds, and presumed_dead once a lease it holds
-- has expired; only the admin role may call it.
BEGIN;
SELECT plan(10);

SELECT tests.clear_runs();

-- Worker wa holds one attempt of p1 and one of p2; worker wb ended p3's.
SELECT runrelay.enqueue_run(run_id => 'p1', queue => 'pq');
SELECT runrelay.enqueue_run(run_id => 'p2', queue => 'pq');
SELECT runrelay.enqueue_run(run_id => 'p3', queue => 'pq3');
SELECT count(*) FROM runrelay.claim_attempts(worker => 'wa', queues => ARRAY['pq'], max_runs => 2);
SELECT runrelay.complete_attempt(c.run_id, c.attempt, c.lease_token)
FROM tests.claim_run('p3', 'wb') AS c;
-- Relay fixture acknowledged run.queued of l1; relay rx holds l1's lane.
SELECT tests.ledger_run('l1');
SELECT tests.append('l1', ARRAY['e1']);
SELECT count(*) FROM runrelay.claim_ledger(relay => 'rx', run_id => 'l1', lease_seconds => 30);

SELECT results_eq(
    $$SELECT name, kind, held, presumed_dead FROM runrelay.list_processes()$$,
    $$VALUES ('wa', 'worker', 2, FALSE), ('wb', 'worker', 0, FALSE),
             ('fixture', 'relay', 0, FALSE), ('rx', 'relay', 1, FALSE)$$,
    'workers then relays, by name: what each holds, nobody dead'
);
SELECT ok(
    (
        SELECT bool_and(p.last_seen_at BETWEEN now() - interval '5 minutes' AND clock_timestamp())
        FROM runrelay.list_processes() AS p
    ),
    'each was seen just now (a lease-only relay: no earlier than its expiry minus 300 s)'
);
SELECT is(
    (
        SELECT p.last_seen_at FROM runrelay.list_processes() AS p
        WHERE p.name = 'wb'
    ),
    (
        SELECT a.finished_at FROM runrelay.attempts AS a
        WHERE a.run_id = 'p3'
    ),
    'a worker that holds nothing: seen when it last ended an attempt'
);

-- Ten minutes on: every lease has lapsed, nobody took it over or reaped it.
SELECT tests.set_clock(interval '10 minutes');
SELECT results_eq(
    $$SELECT name, kind, held, presumed_dead FROM runrelay.list_processes()$$,
    $$VALUES ('wa', 'worker', 2, TRUE), ('wb', 'worker', 0, FALSE),
             ('fixture', 'relay', 0, FALSE), ('rx', 'relay', 1, TRUE)$$,
    'a holder of expired leases is presumed dead; one holding nothing is not'
);

-- The relay renews: alive again.
SELECT tests.set_clock(interval '0 minutes');
SELECT runrelay.renew_ledger_lease(relay => 'rx', event_ids => ARRAY[tests.eid('l1', 'e1')], lease_seconds => 300);
SELECT tests.set_clock(interval '2 minutes');
SELECT is(
    (
        SELECT p.presumed_dead FROM runrelay.list_processes() AS p
        WHERE p.name = 'rx'
    ), FALSE,
    'a renewed lease: alive'
);

-- Two hours on: those that hold nothing have not been seen for an hour.
SELECT tests.set_clock(interval '2 hours');
SELECT results_eq(
    $$SELECT name, kind, held, presumed_dead FROM runrelay.list_processes()$$,
    $$VALUES ('wa', 'worker', 2, TRUE), ('rx', 'relay', 1, TRUE)$$,
    'after an hour only the holders are listed'
);

-- The reaper takes wa's attempts back: wa holds nothing, seen two hours ago.
SELECT count(*) FROM runrelay.reap_expired();
SELECT is(
    array(
        SELECT p.name FROM runrelay.list_processes() AS p
        WHERE p.kind = 'worker'
    ), '{}'::text[],
    'a reaped worker that was not seen for an hour drops out'
);

-- Just inside and just outside the hour.
SELECT tests.set_clock(interval '0 minutes');
SELECT tests.set_clock(
    (
        SELECT a.finished_at FROM runrelay.attempts AS a
        WHERE a.run_id = 'p3'
    ) - now() + interval '59 minutes'
);
SELECT ok('wb' = any(array(SELECT p.name FROM runrelay.list_processes() AS p)), 'seen 59 minutes ago: listed');
SELECT tests.set_clock(
    (
        SELECT a.finished_at FROM runrelay.attempts AS a
        WHERE a.run_id = 'p3'
    ) - now() + interval '61 minutes'
);
SELECT ok(NOT 'wb' = any(array(SELECT p.name FROM runrelay.list_processes() AS p)), 'seen 61 minutes ago: not listed');

SET LOCAL ROLE runrelay_worker;
SELECT throws_ok($$SELECT * FROM runrelay.list_processes()$$, '42501', NULL, 'a worker may not list processes');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
