-- requeue_ledger_event and prune (SPEC §3.3): an operator unblocks a failed
-- event (true) or gets false for anything else; prune deletes only delivered
-- events older than the cut-off, oldest first, at most max_rows, and the
-- delivery records (one per acknowledgement) left without events.
BEGIN;
SELECT plan(22);

-- prune() is installation-wide: start from an empty ledger.
SELECT tests.clear_runs();

-- requeue_ledger_event.
SELECT tests.ledger_run('q1');
SELECT tests.append('q1', ARRAY['a', 'b']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'q1');
SELECT runrelay.fail_ledger('x', tests.eids('q1', ARRAY['a']), '{"http": 410}', permanent => TRUE);
SELECT is(runrelay.requeue_ledger_event(tests.eid('q1', 'a')), TRUE, 'requeueing a failed event answers true');
SELECT results_eq(
    $$SELECT state, failed_at, delivery_attempts, last_error, next_attempt_at <= statement_timestamp()
      FROM runrelay.ledger WHERE event_id = tests.eid('q1', 'a')$$,
    $$VALUES ('pending', NULL::timestamptz, 0, '{"http": 410}'::jsonb, TRUE)$$,
    'it is pending and due now, its attempts reset and its last_error kept'
);
SELECT is(
    (
        SELECT blocked FROM runrelay.ledger_lanes
        WHERE run_id = 'q1' AND lane = 'lifecycle'
    ), FALSE,
    'its lane is unblocked'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', run_id => 'q1')$$,
    $$VALUES ('claimed', 'a')$$,
    'the requeued event is claimable again'
);
SELECT is(runrelay.requeue_ledger_event(tests.eid('q1', 'a')), FALSE, 'a leased event: false');
SELECT is(tests.ev_state(tests.eid('q1', 'a')), 'leased:y', '... and its lease is untouched');
SELECT is(runrelay.requeue_ledger_event(tests.eid('q1', 'b')), FALSE, 'a pending event: false');
SELECT is(runrelay.requeue_ledger_event(tests.eid('q1', 'run.queued')), FALSE, 'a delivered event: false');
SELECT is(tests.ev_state(tests.eid('q1', 'run.queued')), 'delivered:fixture', '... and it stays delivered');
SELECT is(runrelay.requeue_ledger_event(-1), FALSE, 'an unknown event: false');

-- prune.
SELECT tests.ledger_run('p1');
SELECT set_config('runrelay.clock_offset', '-4 hours', TRUE);
SELECT tests.append('p1', ARRAY['d3', 'd2', 'd1', 'leased', 'pending'], 'observability');
SELECT set_config('runrelay.clock_offset', '-3 hours', TRUE);
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'p1');
SELECT runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['d3']), claim_next => 1);
SELECT set_config('runrelay.clock_offset', '-2 hours', TRUE);
SELECT runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['d2']), claim_next => 1);
SELECT set_config('runrelay.clock_offset', '-1 hours', TRUE);
SELECT runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['d1']), claim_next => 1);
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT tests.ledger_run('p2');
SELECT set_config('runrelay.clock_offset', '-5 hours', TRUE);
SELECT tests.append('p2', ARRAY['failed'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'p2');
SELECT runrelay.fail_ledger('x', tests.eids('p2', ARRAY['failed']), '{}', permanent => TRUE);
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT is(
    tests.ledger_states('p1'),
    ARRAY['run.queued=delivered:fixture', 'd3=delivered:x', 'd2=delivered:x', 'd1=delivered:x', 'leased=leased:x', 'pending=pending'],
    'fixture: three events delivered 3, 2 and 1 hours ago, one leased, one pending'
);
SELECT is(runrelay.prune(now() - interval '4 hours'), 0, 'nothing was delivered before the cut-off');
SELECT is(runrelay.prune(now() - interval '90 minutes', max_rows => 1), 1, 'max_rows bounds the deletion');
SELECT is((tests.ledger_states('p1'))[2:3], ARRAY['d2=delivered:x', 'd1=delivered:x'], 'the oldest delivered event went first');
SELECT results_eq(
    $$SELECT t.type FROM runrelay.ledger_deliveries AS d
      INNER JOIN runrelay.ledger_events AS t ON d.run_id = t.run_id AND d.lane = t.lane AND d.last_seq = t.seq
      WHERE d.run_id = 'p1' AND d.lane = 'observability' ORDER BY d.last_seq$$,
    $$VALUES ('d2'), ('d1')$$,
    '... and its acknowledgement, left without events, with it'
);
SELECT is(runrelay.prune(now() - interval '90 minutes'), 1, 'the next call deletes the rest before the cut-off');
SELECT is(
    tests.ledger_states('p1'),
    ARRAY['run.queued=delivered:fixture', 'd1=delivered:x', 'leased=leased:x', 'pending=pending'],
    'events delivered after the cut-off stay'
);
SELECT is(
    runrelay.prune(now() + interval '1 hour'), 4,
    'a later cut-off deletes the remaining delivered events (d1 and the three run.queued)'
);
SELECT is(
    tests.ledger_states('p1'), ARRAY['leased=leased:x', 'pending=pending'],
    'leased and pending events are never pruned'
);
SELECT is(tests.ledger_states('p2'), ARRAY['failed=failed'], 'a failed event is never pruned, however old');
SELECT is(runrelay.prune(now() + interval '1 hour'), 0, 'nothing left to prune');
SELECT is((SELECT count(*) FROM runrelay.ledger_deliveries), 0::bigint, '... and no acknowledgement is left');

SELECT * FROM finish();
ROLLBACK;
