-- claim_ledger (SPEC §3.3): what a claim returns, the head blocking its
-- successors (leased elsewhere, failed, not due), re-claims by the same relay,
-- expired leases, independent lanes, batch sizes, expected_head, discovery
-- order, call_id replays and lease clamping.
BEGIN;
SELECT plan(44);

-- A fresh run: its head is run.queued (seq 1).
SELECT runrelay.enqueue_run(run_id => 'r1', queue => 'q-r1');
SELECT results_eq(
    $$SELECT kind, run_id, seq, type, delivery_key, frozen, tests.lease_granted(lease_expires_at, lease_remaining_ms, 30)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'r1')$$,
    $$VALUES ('claimed', 'r1', 1::bigint, 'run.queued', 'r1:1', FALSE, TRUE)$$,
    'a claim leases the head: kind claimed, not frozen, a 30 s lease'
);
SELECT results_eq(
    $$SELECT state, lease_owner, lease_expires_at - created_at >= interval '30 seconds', delivery_attempts
      FROM runrelay.ledger WHERE run_id = 'r1' AND seq = 1$$,
    $$VALUES ('leased', 'x', TRUE, 0)$$,
    'the head is leased to the relay; claiming charges no delivery attempt'
);

-- The head blocks its successors: leased to another relay.
SELECT tests.append('r1', ARRAY['e2', 'e3']);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'y', run_id => 'r1')$$,
    'a head leased to another relay yields nothing for that run'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'y', run_id => 'r1', max_events => 10, batch => TRUE)$$,
    '... not even its successors in a batch'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'y', run_id => 'r1', wait_for_run => TRUE)$$,
    '... nor with wait_for_run'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'y')$$,
    '... and discovery does not offer it'
);
SELECT is(tests.ledger_states('r1'), ARRAY['run.queued=leased:x', 'e2=pending', 'e3=pending'], 'nothing changed');

-- The same relay re-claims its head with the lease extended.
SELECT results_eq(
    $$SELECT kind, type, tests.lease_granted(lease_expires_at, lease_remaining_ms, 120)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'r1', lease_seconds => 120)$$,
    $$VALUES ('claimed', 'run.queued', TRUE)$$,
    'a head leased to this relay is re-claimed (the head alone) with its lease extended'
);
SELECT is(
    (
        SELECT lease_expires_at - statement_timestamp() > interval '119 seconds' FROM runrelay.ledger
        WHERE run_id = 'r1' AND seq = 1
    ),
    TRUE,
    'the stored lease was extended'
);

-- Expired leases are taken over; the old owner can no longer acknowledge.
SELECT set_config('runrelay.clock_offset', '1 hour', TRUE);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', run_id => 'r1')$$,
    $$VALUES ('claimed', 'run.queued')$$,
    'after its lease expired, another relay claims the head'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'r1', event_ids => ARRAY[tests.eid('r1', 'run.queued')])$$,
    'the previous owner cannot acknowledge it'
);
SELECT is(tests.ev_state(tests.eid('r1', 'run.queued')), 'leased:y', 'the head is leased to the new owner');
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- A failed head blocks the lane until requeued.
SELECT runrelay.enqueue_run(run_id => 'f1', queue => 'q-f1');
SELECT tests.append('f1', ARRAY['e2']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f1');
SELECT runrelay.fail_ledger('x', ARRAY[tests.eid('f1', 'run.queued')], '{"http": 500}', permanent => TRUE);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'f1', max_events => 5, batch => TRUE)$$,
    'a failed head yields nothing for that run'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'z', lane => 'lifecycle') WHERE run_id = 'f1'$$,
    'discovery skips a blocked lane'
);
SELECT is(tests.ev_state(tests.eid('f1', 'e2')), 'pending', 'the successor of a failed head stays pending');

-- Lanes are independent: the observability lane of f1 flows.
SELECT tests.append('f1', ARRAY['log1'], 'observability');
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'f1')$$,
    $$VALUES ('claimed', 'log1')$$,
    'a blocked lifecycle lane does not block the observability lane'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', lane => 'lifecycle', run_id => 'r1')$$,
    $$VALUES ('claimed', 'run.queued')$$,
    'and a leased observability head does not affect the lifecycle lane of another run'
);

-- A head not yet due blocks the lane until its time.
SELECT runrelay.enqueue_run(run_id => 'd1', queue => 'q-d1');
SELECT tests.append('d1', ARRAY['e2']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'd1');
SELECT runrelay.fail_ledger('x', ARRAY[tests.eid('d1', 'run.queued')], '{}', retry_at => now() + interval '1 hour');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'd1', max_events => 5, batch => TRUE)$$,
    'a head not yet due yields nothing for that run (its successors wait too)'
);
SELECT set_config('runrelay.clock_offset', '61 minutes', TRUE);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 'd1')$$,
    $$VALUES ('claimed', 'run.queued')$$,
    'once due, the head is claimable again'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- Batch sizes.
SELECT tests.ledger_run('b1');
SELECT tests.append('b1', ARRAY['a', 'b', 'c', 'd']);
SELECT results_eq(
    $$SELECT type, frozen FROM runrelay.claim_ledger(relay => 'x', run_id => 'b1', max_events => 5)$$,
    $$VALUES ('a', FALSE)$$,
    'batch => false claims the head alone, whatever max_events'
);
SELECT runrelay.release_ledger('x', ARRAY[tests.eid('b1', 'a')]);
SELECT results_eq(
    $$SELECT type, frozen FROM runrelay.claim_ledger(relay => 'x', run_id => 'b1', max_events => 3, batch => TRUE)$$,
    $$VALUES ('a', TRUE), ('b', TRUE), ('c', TRUE)$$,
    'batch => true claims up to max_events consecutive events, in order, frozen (lifecycle lane too)'
);
SELECT is(tests.ev_state(tests.eid('b1', 'd')), 'pending', 'the event beyond max_events is not leased');

-- expected_head.
SELECT tests.ledger_run('h1');
SELECT tests.append('h1', ARRAY['a', 'b']);
SELECT is_empty(
    format(
        'SELECT * FROM runrelay.claim_ledger(relay => %L, run_id => %L, expected_head => %s)', 'x', 'h1', tests.eid('h1', 'b')
    ),
    'expected_head: nothing when the head is another event'
);
SELECT is(tests.ev_state(tests.eid('h1', 'a')), 'pending', '... and nothing is leased');
SELECT results_eq(
    format(
        'SELECT type FROM runrelay.claim_ledger(relay => %L, run_id => %L, expected_head => %s)', 'x', 'h1', tests.eid('h1', 'a')
    ),
    $$VALUES ('a')$$,
    'expected_head: the head is claimed when it is that event'
);

-- Discovery: oldest head first, skipping lanes leased elsewhere.
SELECT tests.ledger_run('old');
SELECT tests.ledger_run('older');
SELECT tests.ledger_run('oldest');
SELECT set_config('runrelay.clock_offset', '-3 hours', TRUE);
SELECT tests.append('oldest', ARRAY['o1'], 'observability');
SELECT set_config('runrelay.clock_offset', '-2 hours', TRUE);
SELECT tests.append('older', ARRAY['o2'], 'observability');
SELECT set_config('runrelay.clock_offset', '-1 hours', TRUE);
SELECT tests.append('old', ARRAY['o3'], 'observability');
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT runrelay.claim_ledger(relay => 'other', lane => 'observability', run_id => 'oldest');
SELECT results_eq(
    $$SELECT run_id, type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability')$$,
    $$VALUES ('older', 'o2')$$,
    'discovery takes the oldest due head, skipping a lane whose head another relay leases'
);
SELECT results_eq(
    $$SELECT run_id, type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability')$$,
    $$VALUES ('old', 'o3')$$,
    'the next discovery takes the next oldest (its own lease is not offered again)'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => 'observability') WHERE run_id IN ('old', 'older', 'oldest')$$,
    'nothing else is due in those lanes'
);

-- call_id replays.
SELECT tests.ledger_run('c1');
SELECT tests.append('c1', ARRAY['a', 'b', 'c']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', run_id => 'c1', max_events => 2, batch => TRUE, call_id => '00000000-0000-4000-8000-0000000000c1')$$,
    $$VALUES ('claimed', 'a'), ('claimed', 'b')$$,
    'a claim with a call_id'
);
SELECT results_eq(
    $$SELECT kind, run_id, type, frozen FROM runrelay.claim_ledger(relay => 'x', call_id => '00000000-0000-4000-8000-0000000000c1')$$,
    $$VALUES ('claimed', 'c1', 'a', TRUE), ('claimed', 'c1', 'b', TRUE)$$,
    'repeating the call with its call_id returns the same leases as claimed'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', run_id => 'c1', max_events => 2, batch => TRUE, call_id => '00000000-0000-4000-8000-0000000000c1')$$,
    $$VALUES ('claimed', 'a'), ('claimed', 'b')$$,
    'a replay with the original arguments returns the same leases, not a wider batch'
);
SELECT is(tests.ev_state(tests.eid('c1', 'c')), 'pending', 'the replay leased nothing more');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', call_id => '00000000-0000-4000-8000-0000000000c2') WHERE run_id = 'c1'$$,
    'another call_id does not see them'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'y', call_id => '00000000-0000-4000-8000-0000000000c1') WHERE run_id = 'c1'$$,
    'another relay with the same call_id does not see them'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', run_id => 'h1', call_id => '00000000-0000-4000-8000-0000000000c3')$$,
    $$VALUES ('claimed', 'a')$$,
    'a call_id that never committed a claim does the work afresh'
);

-- Lease length: clamped to 5..300 s, running from the grant;
-- lease_remaining_ms measured when the call answers.
SELECT tests.ledger_run('l1');
SELECT tests.append('l1', ARRAY['a']);
SELECT results_eq(
    $$SELECT tests.lease_granted(lease_expires_at, lease_remaining_ms, 5)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'l1', lease_seconds => 1)$$,
    $$VALUES (TRUE)$$,
    'lease_seconds below 5 is clamped to 5'
);
SELECT results_eq(
    $$SELECT tests.lease_granted(lease_expires_at, lease_remaining_ms, 5)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'l1', lease_seconds => -10)$$,
    $$VALUES (TRUE)$$,
    'a negative lease_seconds is clamped to 5'
);
SELECT results_eq(
    $$SELECT tests.lease_granted(lease_expires_at, lease_remaining_ms, 300)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'l1', lease_seconds => 1000)$$,
    $$VALUES (TRUE)$$,
    'lease_seconds above 300 is clamped to 300'
);
SELECT results_eq(
    $$SELECT tests.lease_granted(lease_expires_at, lease_remaining_ms, 30)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 'l1', lease_seconds => NULL)$$,
    $$VALUES (TRUE)$$,
    'a null lease_seconds means the default 30 s'
);
SELECT set_config('runrelay.clock_offset', '10 seconds', TRUE);
SELECT results_eq(
    $$SELECT
          lease_remaining_ms
          <= floor(extract(EPOCH FROM lease_expires_at - (statement_timestamp() + interval '10 seconds')) * 1000)::bigint,
          lease_remaining_ms
          >= floor(extract(EPOCH FROM lease_expires_at - (clock_timestamp() + interval '10 seconds')) * 1000)::bigint,
          lease_remaining_ms <= 20000
      FROM runrelay.claim_ledger(relay => 'x', call_id => '00000000-0000-4000-8000-0000000000c1')$$,
    $$VALUES (TRUE, TRUE, TRUE), (TRUE, TRUE, TRUE)$$,
    'a replay reports the remaining lease measured when it answers, without extending it'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- A run without ledger work and an unknown run yield nothing.
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'l1')$$,
    'a lane without events yields nothing'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'no-such-run')$$,
    'an unknown run yields nothing'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger
        WHERE lease_owner = 'x' AND run_id = 'l1'
    ), 1::bigint,
    'repeated claims of one head never lease more than that head'
);

-- claim_ledger's row type is ack_ledger's without its last column, lag_ms:
-- the same names, types and order (two types only because PostgreSQL cannot
-- derive one from the other; see 00_types.sql).
SELECT results_eq(
    $$SELECT c.attname, c.type
      FROM (
          SELECT a.attnum, a.attname::text, format_type(a.atttypid, a.atttypmod) AS type
          FROM pg_attribute AS a
          WHERE a.attrelid = 'runrelay.claim_ledger_result'::regclass AND a.attnum > 0 AND NOT a.attisdropped
          UNION ALL
          SELECT 10000, 'lag_ms', 'bigint'
      ) AS c
      ORDER BY c.attnum$$,
    $$SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
      FROM pg_attribute AS a
      WHERE a.attrelid = 'runrelay.ack_ledger_result'::regclass AND a.attnum > 0 AND NOT a.attisdropped
      ORDER BY a.attnum$$,
    'claim_ledger_result is ack_ledger_result without its last column, lag_ms'
);

SELECT * FROM finish();
ROLLBACK;
