-- Bad input to the ledger functions (SPEC §5, §6): 22023 for every malformed
-- argument (54000 for an oversized error). That a raising call changes
-- nothing is the statement's atomicity (throws_ok runs it in a savepoint),
-- so it is not asserted separately.
BEGIN;
SELECT plan(53);

SELECT tests.ledger_run('r1');
SELECT tests.append('r1', ARRAY['a', 'b']);
SELECT tests.append('r1', ARRAY['obs'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'r1');

-- claim_ledger.
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => '')$$, '22023', NULL, 'claim_ledger: empty relay');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => '   ')$$, '22023', NULL, 'claim_ledger: blank relay');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => NULL)$$, '22023', NULL, 'claim_ledger: null relay');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => repeat('r', 201))$$, '22023', NULL, 'claim_ledger: relay over 200 characters'
);
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => 'audit')$$, '22023', NULL, 'claim_ledger: unknown lane');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => NULL)$$, '22023', NULL, 'claim_ledger: null lane');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => '')$$, '22023', NULL, 'claim_ledger: empty run_id');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', max_events => 0)$$, '22023', NULL, 'claim_ledger: max_events 0');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', max_events => -1)$$, '22023', NULL, 'claim_ledger: negative max_events'
);
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', max_events => 1001)$$, '22023', NULL, 'claim_ledger: max_events 1001');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', max_events => NULL)$$, '22023', NULL, 'claim_ledger: null max_events');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x', batch => NULL)$$, '22023', NULL, 'claim_ledger: null batch');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', wait_for_run => NULL)$$, '22023', NULL, 'claim_ledger: null wait_for_run'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => '', call_id => '00000000-0000-4000-8000-000000000001')$$,
    '22023', NULL, 'claim_ledger: bad input is rejected before a call_id replay'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'probe', max_events => 1000, batch => TRUE) WHERE FALSE$$,
    'claim_ledger: max_events 1000 is allowed'
);

-- ack_ledger.
SELECT throws_ok($$SELECT * FROM runrelay.ack_ledger('', 'r1', '{1}')$$, '22023', NULL, 'ack_ledger: empty relay');
SELECT throws_ok($$SELECT * FROM runrelay.ack_ledger('x', '', '{1}')$$, '22023', NULL, 'ack_ledger: empty run_id');
SELECT throws_ok($$SELECT * FROM runrelay.ack_ledger('x', NULL, '{1}')$$, '22023', NULL, 'ack_ledger: null run_id');
SELECT throws_ok($$SELECT * FROM runrelay.ack_ledger('x', 'r1', NULL)$$, '22023', NULL, 'ack_ledger: null event_ids');
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, ARRAY[%s, NULL])', 'x', 'r1', tests.eid('r1', 'a')),
    '22023', NULL, 'ack_ledger: event_ids with a null element'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.ack_ledger('x', 'r1', ARRAY(SELECT generate_series(1, 10001)::bigint))$$,
    '22023', NULL, 'ack_ledger: more than 10000 event_ids'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, ARRAY[%s], claim_next => -1)', 'x', 'r1', tests.eid('r1', 'a')),
    '22023', NULL, 'ack_ledger: negative claim_next'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, ARRAY[%s], claim_next => 1001)', 'x', 'r1', tests.eid('r1', 'a')),
    '22023', NULL, 'ack_ledger: claim_next 1001'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, ARRAY[%s], claim_next => NULL)', 'x', 'r1', tests.eid('r1', 'a')),
    '22023', NULL, 'ack_ledger: null claim_next'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, ARRAY[%s], batch => NULL)', 'x', 'r1', tests.eid('r1', 'a')),
    '22023', NULL, 'ack_ledger: null batch'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.ack_ledger(%L, %L, %L::bigint[])', 'x', 'r1', tests.eids('r1', ARRAY['a', 'obs'])),
    '22023', NULL, 'ack_ledger: event_ids mixing both lanes'
);

-- renew_ledger_lease.
SELECT throws_ok($$SELECT * FROM runrelay.renew_ledger_lease('', '{1}')$$, '22023', NULL, 'renew_ledger_lease: empty relay');
SELECT throws_ok($$SELECT * FROM runrelay.renew_ledger_lease('x', NULL)$$, '22023', NULL, 'renew_ledger_lease: null event_ids');
SELECT throws_ok(
    format('SELECT * FROM runrelay.renew_ledger_lease(%L, ARRAY[%s, NULL])', 'x', tests.eid('r1', 'a')),
    '22023', NULL, 'renew_ledger_lease: event_ids with a null element'
);

-- release_ledger.
SELECT throws_ok($$SELECT runrelay.release_ledger('', '{1}')$$, '22023', NULL, 'release_ledger: empty relay');
SELECT throws_ok($$SELECT runrelay.release_ledger(NULL, '{1}')$$, '22023', NULL, 'release_ledger: null relay');
SELECT throws_ok($$SELECT runrelay.release_ledger('x', NULL)$$, '22023', NULL, 'release_ledger: null event_ids');
SELECT throws_ok(
    format('SELECT runrelay.release_ledger(%L, ARRAY[%s, NULL])', 'x', tests.eid('r1', 'a')),
    '22023', NULL, 'release_ledger: event_ids with a null element'
);

-- fail_ledger.
SELECT throws_ok($$SELECT * FROM runrelay.fail_ledger('', '{1}', '{}')$$, '22023', NULL, 'fail_ledger: empty relay');
SELECT throws_ok($$SELECT * FROM runrelay.fail_ledger('x', NULL, '{}')$$, '22023', NULL, 'fail_ledger: null event_ids');
SELECT throws_ok(
    format('SELECT * FROM runrelay.fail_ledger(%L, ARRAY[%s, NULL], %L)', 'x', tests.eid('r1', 'a'), '{}'),
    '22023', NULL, 'fail_ledger: event_ids with a null element'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.fail_ledger(%L, ARRAY[%s], NULL)', 'x', tests.eid('r1', 'a')),
    '22023', NULL, 'fail_ledger: null error'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.fail_ledger(%L, ARRAY[%s], %L, retry_at => %L)', 'x', tests.eid('r1', 'a'), '{}', 'infinity'),
    '22023', NULL, 'fail_ledger: infinite retry_at'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.fail_ledger(%L, ARRAY[%s], %L, permanent => NULL)', 'x', tests.eid('r1', 'a'), '{}'),
    '22023', NULL, 'fail_ledger: null permanent'
);
UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT throws_ok(
    format(
        'SELECT * FROM runrelay.fail_ledger(%L, ARRAY[%s], jsonb_build_object(%L, repeat(%L, 2000)))', 'x', tests.eid('r1', 'a'), 'm', 'x'
    ),
    '54000', NULL, 'fail_ledger: an error beyond max_payload_bytes raises 54000'
);
UPDATE runrelay.settings SET max_payload_bytes = 1048576;

-- requeue_ledger_event, prune, ledger_next_due_at.
SELECT throws_ok($$SELECT runrelay.requeue_ledger_event(NULL)$$, '22023', NULL, 'requeue_ledger_event: null event_id');
SELECT throws_ok($$SELECT runrelay.prune(NULL)$$, '22023', NULL, 'prune: null delivered_before');
SELECT throws_ok($$SELECT runrelay.prune('infinity')$$, '22023', NULL, 'prune: infinite delivered_before');
SELECT throws_ok($$SELECT runrelay.prune(now(), max_rows => 0)$$, '22023', NULL, 'prune: max_rows 0');
SELECT throws_ok($$SELECT runrelay.prune(now(), max_rows => -5)$$, '22023', NULL, 'prune: negative max_rows');
SELECT throws_ok($$SELECT runrelay.prune(now(), max_rows => NULL)$$, '22023', NULL, 'prune: null max_rows');
SELECT throws_ok($$SELECT runrelay.ledger_next_due_at(lane => 'audit')$$, '22023', NULL, 'ledger_next_due_at: unknown lane');
SELECT throws_ok($$SELECT runrelay.ledger_next_due_at(run_id => '')$$, '22023', NULL, 'ledger_next_due_at: empty run_id');

-- Isolation level (SPEC §4): 25000 outside READ COMMITTED.
SELECT throws_ok(
    $q$SELECT * FROM dblink(
        format('dbname=%s port=%s host=%s user=%s', current_database(), current_setting('port'),
               coalesce(host(inet_server_addr()), split_part(current_setting('unix_socket_directories'), ',', 1)), current_user),
        'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM runrelay.claim_ledger(relay => ''x''); COMMIT;'
    ) AS t (n bigint)$q$,
    '25000', NULL, 'claim_ledger refuses a REPEATABLE READ transaction (25000)'
);
SELECT lives_ok(
    $$SELECT runrelay.ledger_next_due_at()$$,
    'and works under READ COMMITTED'
);

-- Lease lengths are clamped, never rejected.
SELECT lives_ok(
    $$SELECT * FROM runrelay.renew_ledger_lease('x', '{}', lease_seconds => -100)$$,
    'renew_ledger_lease: a negative lease_seconds is clamped, not rejected'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.ack_ledger('x', 'r1', '{}', lease_seconds => 100000)$$,
    'ack_ledger: a huge lease_seconds is clamped, not rejected'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'probe', lease_seconds => 0) WHERE FALSE$$,
    'claim_ledger: lease_seconds 0 is clamped, not rejected'
);

SELECT * FROM finish();
ROLLBACK;
