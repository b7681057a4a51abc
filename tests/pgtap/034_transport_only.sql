-- Transport-only events (SPEC §1, §3.3): a transport-only head with a
-- claimable successor is acknowledged locally by the claim (kind local_ack);
-- a lone one rests until a successor is appended; call_id replays report
-- local acks again.
BEGIN;
SELECT plan(20);

-- Head with a claimable successor.
SELECT tests.ledger_run('t1');
SELECT tests.append('t1', ARRAY['t'], 'lifecycle', TRUE);
SELECT tests.append('t1', ARRAY['a', 'b']);
SELECT results_eq(
    $$SELECT kind, type, seq, frozen, lease_expires_at IS NULL, lease_remaining_ms
      FROM runrelay.claim_ledger(relay => 'x', run_id => 't1')$$,
    $$VALUES ('local_ack', 't', 2::bigint, FALSE, TRUE, NULL::bigint), ('claimed', 'a', 3::bigint, FALSE, FALSE, 30000::bigint)$$,
    'a transport-only head is acknowledged locally and its successor claimed, in one call'
);
SELECT results_eq(
    $$SELECT state, delivered_by, lease_owner FROM runrelay.ledger WHERE event_id = tests.eid('t1', 't')$$,
    $$VALUES ('delivered', 'x', NULL::text)$$,
    'the local ack marks the event delivered by the claiming relay'
);
SELECT is(tests.ev_state(tests.eid('t1', 'b')), 'pending', 'batch => false: only the head behind it is claimed');

-- A lone transport-only head rests.
SELECT tests.ledger_run('t2');
SELECT tests.append('t2', ARRAY['t'], 'lifecycle', TRUE);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 't2', max_events => 5, batch => TRUE)$$,
    'a lone transport-only head is neither delivered nor acknowledged'
);
SELECT is(tests.ev_state(tests.eid('t2', 't')), 'pending', 'it stays pending (resting)');
SELECT tests.append('t2', ARRAY['a']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', run_id => 't2')$$,
    $$VALUES ('local_ack', 't'), ('claimed', 'a')$$,
    'once a successor is appended, the next claim acknowledges it locally and claims the successor'
);

-- Consecutive transport-only events: all but a resting last one are acked.
SELECT tests.ledger_run('t3');
SELECT tests.append('t3', ARRAY['t1', 't2'], 'lifecycle', TRUE);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 't3')$$,
    $$VALUES ('local_ack', 't1')$$,
    'of two transport-only events the first is acked (its successor is claimable), the second rests'
);
SELECT is(tests.ev_state(tests.eid('t3', 't2')), 'pending', 'the second transport-only event rests');
SELECT tests.append('t3', ARRAY['a', 'b']);
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.claim_ledger(relay => 'x', run_id => 't3', max_events => 5, batch => TRUE)$$,
    $$VALUES ('local_ack', 't2', FALSE), ('claimed', 'a', TRUE), ('claimed', 'b', TRUE)$$,
    'local acks precede a batch claim of the events behind them'
);

-- A transport-only successor ends a batch.
SELECT tests.ledger_run('t4');
SELECT tests.append('t4', ARRAY['a', 'b']);
SELECT tests.append('t4', ARRAY['t'], 'lifecycle', TRUE);
SELECT tests.append('t4', ARRAY['c']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 't4', max_events => 10, batch => TRUE)$$,
    $$VALUES ('claimed', 'a'), ('claimed', 'b')$$,
    'a batch stops before a transport-only event'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 't4', event_ids => tests.eids('t4', ARRAY['a', 'b']), claim_next => 10, batch => TRUE)$$,
    $$VALUES ('delivered', 'a'), ('delivered', 'b'), ('local_ack', 't'), ('claimed', 'c')$$,
    'ack with claim_next acknowledges it locally and claims what follows'
);

-- call_id replays report local acks again.
SELECT tests.ledger_run('t5');
SELECT tests.append('t5', ARRAY['t'], 'observability', TRUE);
SELECT tests.append('t5', ARRAY['a'], 'observability');
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't'), ('claimed', 'a')$$,
    'a claim with a call_id acknowledges locally and claims'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't'), ('claimed', 'a')$$,
    'its replay reports the local ack as local_ack and the lease as claimed'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', call_id => '00000000-0000-4000-8000-0000000000a6') WHERE run_id = 't5'$$,
    'another call_id does not see them'
);
SELECT runrelay.ack_ledger(relay => 'x', run_id => 't5', event_ids => ARRAY[tests.eid('t5', 'a')]);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't')$$,
    'after the lease was acknowledged, a replay still reports the local ack and leases nothing new'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(
        relay => 'y', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    'another relay with the same call_id is not told about x''s local ack'
);

-- Resting lanes are not due and do not hide claimable work from discovery.
SELECT tests.ledger_run('rest');
SELECT tests.append('rest', ARRAY['t'], 'observability', TRUE);
SELECT is(
    runrelay.ledger_next_due_at(lane => 'observability', run_id => 'rest'), NULL,
    'a lone transport-only head is not due'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'rest')$$,
    'a claim of the resting lane yields nothing'
);
SELECT is(
    runrelay.ledger_next_due_at(lane => 'observability', run_id => 'rest'), NULL,
    'after that claim the resting lane is still not due'
);
SELECT set_config('runrelay.clock_offset', '-1 hour', TRUE);
SELECT tests.ledger_run('rest' || i) FROM generate_series(1, 11) AS i;
SELECT tests.append('rest' || i, ARRAY['t'], 'observability', TRUE) FROM generate_series(1, 11) AS i;
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT tests.ledger_run('work');
SELECT tests.append('work', ARRAY['job'], 'observability');
SELECT results_eq(
    $$SELECT run_id, kind, type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability')$$,
    $$VALUES ('work', 'claimed', 'job')$$,
    'discovery finds claimable work even behind many older resting transport-only lanes'
);

SELECT * FROM finish();
ROLLBACK;
