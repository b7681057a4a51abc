-- Frozen batches (SPEC §3.3, batch => true): membership fixed at the first
-- claim and re-delivered exactly after a failure, an expired lease or a
-- release, even when new events were appended; never widened; shrunk only by
-- acknowledgement.
BEGIN;
SELECT plan(21);

SELECT tests.ledger_run('b1');
SELECT tests.append('b1', ARRAY['a', 'b', 'c'], 'observability');
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 'b1', max_events => 3, batch => TRUE)$$,
    $$VALUES ('claimed', 'a', TRUE), ('claimed', 'b', TRUE), ('claimed', 'c', TRUE)$$,
    'a batch claim freezes its members'
);
SELECT is(
    (
        SELECT count(DISTINCT batch_id) FROM runrelay.ledger
        WHERE run_id = 'b1' AND lane = 'observability' AND batch_id IS NOT NULL
    ),
    1::bigint,
    'the members share one batch'
);
SELECT tests.append('b1', ARRAY['d', 'e'], 'observability');

-- After a failure (retrying).
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger(
        'x', tests.eids('b1', ARRAY['a', 'b', 'c']), '{"http": 503}', retry_at => now() - interval '1 second')$$,
    $$VALUES ('retrying'), ('retrying'), ('retrying')$$,
    'the batch fails as a whole, retrying'
);
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 'b1', max_events => 10, batch => TRUE)$$,
    $$VALUES ('claimed', 'a', TRUE), ('claimed', 'b', TRUE), ('claimed', 'c', TRUE)$$,
    'after a failure the batch is re-claimed with exactly its members, not widened to the new events'
);
SELECT is(tests.ev_state(tests.eid('b1', 'd')), 'pending', 'the appended event was not added');

-- After a release.
SELECT is(runrelay.release_ledger('x', tests.eids('b1', ARRAY['a', 'b', 'c'])), 3, 'release hands back the whole batch');
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'y', lane => 'observability', run_id => 'b1', max_events => 10, batch => TRUE)$$,
    $$VALUES ('a'), ('b'), ('c')$$,
    'after a release another relay re-claims exactly the batch'
);

-- After an expired lease.
SELECT set_config('runrelay.clock_offset', '1 hour', TRUE);
SELECT results_eq(
    $$SELECT type, frozen FROM runrelay.claim_ledger(relay => 'z', lane => 'observability', max_events => 10, batch => TRUE)
      WHERE run_id = 'b1'$$,
    $$VALUES ('a', TRUE), ('b', TRUE), ('c', TRUE)$$,
    'after its lease expired, discovery by another relay returns exactly the batch'
);
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'z', lane => 'observability', run_id => 'b1', max_events => 1)$$,
    $$VALUES ('a'), ('b'), ('c')$$,
    'a re-claim without batch (or with a smaller max_events) still returns the whole frozen batch'
);

-- Acknowledgement shrinks it; nothing widens it.
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(relay => 'z', run_id => 'b1', event_ids => ARRAY[tests.eid('b1', 'a')])$$,
    $$VALUES ('delivered', 'a')$$,
    'a prefix of the batch is acknowledged'
);
SELECT is(runrelay.release_ledger('z', tests.eids('b1', ARRAY['b', 'c'])), 2, 'the rest is released');
SELECT results_eq(
    $$SELECT type, frozen
      FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b1', max_events => 10, batch => TRUE)$$,
    $$VALUES ('b', TRUE), ('c', TRUE)$$,
    'the re-claim returns the undelivered members only, still not widened'
);
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.ack_ledger(
        relay => 'x', run_id => 'b1', event_ids => tests.eids('b1', ARRAY['b', 'c']), claim_next => 10, batch => TRUE)$$,
    $$VALUES ('delivered', 'b', TRUE), ('delivered', 'c', TRUE), ('claimed', 'd', TRUE), ('claimed', 'e', TRUE)$$,
    'once the batch is delivered, the next claim forms a new batch from the events behind it'
);
SELECT isnt(
    (
        SELECT batch_id FROM runrelay.ledger
        WHERE event_id = tests.eid('b1', 'd')
    ),
    (
        SELECT batch_id FROM runrelay.ledger
        WHERE event_id = tests.eid('b1', 'a')
    ),
    'a new batch, not the old one'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- Attempts exhausted: every member blocked together.
UPDATE runrelay.settings SET ledger_max_delivery_attempts = 2;
SELECT tests.ledger_run('b2');
SELECT tests.append('b2', ARRAY['a', 'b', 'c'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b2', max_events => 2, batch => TRUE);
SELECT runrelay.fail_ledger('x', tests.eids('b2', ARRAY['a', 'b']), '{}', retry_at => now() - interval '1 second');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b2', max_events => 3, batch => TRUE);
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('b2', ARRAY['a', 'b', 'c']), '{}')$$,
    $$VALUES ('blocked'), ('blocked')$$,
    'the second failure of the batch (a, b only: c was never added) exhausts the attempts of both members'
);
SELECT is(tests.ev_state(tests.eid('b2', 'c')), 'pending', 'the event behind the batch was never leased');

-- A failed frozen batch whose head an operator requeued is claimable again.
SELECT tests.ledger_run('b3');
SELECT tests.append('b3', ARRAY['a', 'b'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b3', max_events => 2, batch => TRUE);
SELECT runrelay.fail_ledger('x', tests.eids('b3', ARRAY['a', 'b']), '{}', permanent => TRUE);
SELECT is(runrelay.requeue_ledger_event(tests.eid('b3', 'a')), TRUE, 'the operator requeues the blocked head');
SELECT lives_ok(
    $$SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b3', max_events => 2, batch => TRUE)$$,
    'claiming the lane after the requeue is an outcome, not an error'
);
SELECT is(tests.ev_state(tests.eid('b3', 'a')), 'leased:x', 'the requeued head is delivered again');

-- A new batch takes the head's successors up to the first that is not
-- claimable: one not yet due, or one that failed, ends it.
SELECT tests.ledger_run('b4');
SELECT tests.append('b4', ARRAY['a', 'b', 'c', 'd'], 'observability');
UPDATE runrelay.ledger_events SET next_attempt_at = now() + interval '1 hour'
WHERE event_id = tests.eid('b4', 'c');
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b4', max_events => 10, batch => TRUE)$$,
    $$VALUES ('a'), ('b')$$,
    'a batch stops before a successor that is not yet due'
);
SELECT tests.ledger_run('b5');
SELECT tests.append('b5', ARRAY['a', 'b', 'c'], 'observability');
UPDATE runrelay.ledger_events SET failed_at = now(), next_attempt_at = now() + interval '1 hour'
WHERE event_id = tests.eid('b5', 'b');
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'b5', max_events => 10, batch => TRUE)$$,
    $$VALUES ('a')$$,
    'a batch stops before a successor that failed'
);

SELECT * FROM finish();
ROLLBACK;
