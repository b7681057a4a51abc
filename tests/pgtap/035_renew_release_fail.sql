-- renew_ledger_lease, release_ledger and fail_ledger (SPEC §3.3): each acts
-- only on the calling relay's leases; release charges no delivery attempt;
-- fail answers retrying (backoff, attempts + 1) or blocked (permanent, or
-- attempts exhausted).
BEGIN;
SELECT plan(32);

SELECT tests.ledger_run('r1');
SELECT tests.ledger_run('r2');
SELECT tests.append('r1', ARRAY['a']);
SELECT tests.append('r2', ARRAY['b']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'r1', lease_seconds => 10);
SELECT runrelay.claim_ledger(relay => 'y', run_id => 'r2', lease_seconds => 10);

-- renew_ledger_lease.
SELECT results_eq(
    $$SELECT event_id, tests.granted(lease_expires_at, 30)
      FROM runrelay.renew_ledger_lease('x', tests.eids('r1', ARRAY['a']) || tests.eids('r2', ARRAY['b']))$$,
    $$SELECT tests.eid('r1', 'a'), TRUE$$,
    'renew extends (default 30 s) and returns only the events this relay leases'
);
SELECT is(
    (
        SELECT lease_expires_at - statement_timestamp() <= interval '10 seconds' FROM runrelay.ledger
        WHERE event_id = tests.eid('r2', 'b')
    ),
    TRUE,
    'another relay''s lease is left alone'
);
SELECT is(tests.ev_state(tests.eid('r2', 'b')), 'leased:y', '... and stays its');
SELECT results_eq(
    $$SELECT tests.granted(lease_expires_at, 5)
      FROM runrelay.renew_ledger_lease('x', tests.eids('r1', ARRAY['a']), 1)$$,
    $$VALUES (TRUE)$$,
    'renew clamps lease_seconds to at least 5'
);
SELECT results_eq(
    $$SELECT tests.granted(lease_expires_at, 300)
      FROM runrelay.renew_ledger_lease('x', tests.eids('r1', ARRAY['a']), 100000)$$,
    $$VALUES (TRUE)$$,
    'renew clamps lease_seconds to at most 300'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.renew_ledger_lease('x', tests.eids('r1', ARRAY['run.queued']))$$,
    'a delivered event is not renewed'
);
SELECT set_config('runrelay.clock_offset', '1 hour', TRUE);
SELECT results_eq(
    $$SELECT event_id FROM runrelay.renew_ledger_lease('y', tests.eids('r2', ARRAY['b']))$$,
    $$SELECT tests.eid('r2', 'b')$$,
    'a lapsed lease nobody took over is still renewed for its owner'
);
SELECT runrelay.claim_ledger(relay => 'z', run_id => 'r1');
SELECT is(tests.ev_state(tests.eid('r1', 'a')), 'leased:z', 'x''s lapsed lease was taken over by z');
SELECT is_empty(
    $$SELECT * FROM runrelay.renew_ledger_lease('x', tests.eids('r1', ARRAY['a']))$$,
    'after a takeover the old owner renews nothing'
);
SELECT is(runrelay.release_ledger('x', tests.eids('r1', ARRAY['a'])), 0, 'nor can it release it');
SELECT is_empty(
    $$SELECT * FROM runrelay.fail_ledger('x', tests.eids('r1', ARRAY['a']), '{}')$$,
    'nor fail it'
);
SELECT results_eq(
    $$SELECT state, lease_owner, delivery_attempts FROM runrelay.ledger WHERE event_id = tests.eid('r1', 'a')$$,
    $$VALUES ('leased', 'z', 0)$$,
    'the new owner''s lease is intact'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- release_ledger.
SELECT tests.ledger_run('rel');
SELECT tests.append('rel', ARRAY['a', 'b', 'c'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'rel', max_events => 2, batch => TRUE);
SELECT is(
    runrelay.release_ledger('y', tests.eids('rel', ARRAY['a', 'b'])), 0,
    'another relay releases nothing'
);
SELECT is(
    runrelay.release_ledger('x', tests.eids('rel', ARRAY['a', 'b', 'c'])), 2,
    'release returns how many leases it handed back (c was never leased)'
);
SELECT results_eq(
    $$SELECT type, state, lease_owner, lease_expires_at, delivery_attempts, batch_id IS NOT NULL
      FROM runrelay.ledger WHERE run_id = 'rel' AND lane = 'observability' ORDER BY seq$$,
    $$VALUES ('a', 'pending', NULL::text, NULL::timestamptz, 0, TRUE), ('b', 'pending', NULL, NULL, 0, TRUE),
             ('c', 'pending', NULL, NULL, 0, FALSE)$$,
    'released events are pending, charged no delivery attempt, and keep their batch'
);
SELECT is(runrelay.release_ledger('x', tests.eids('rel', ARRAY['a', 'b'])), 0, 'releasing again releases nothing');
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'y', lane => 'observability', run_id => 'rel')$$,
    $$VALUES ('a'), ('b')$$,
    'released events are claimable at once'
);

-- fail_ledger: retrying.
SELECT tests.ledger_run('f1');
SELECT tests.append('f1', ARRAY['a', 'b']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f1');
SELECT is_empty(
    $$SELECT * FROM runrelay.fail_ledger('y', tests.eids('f1', ARRAY['a']), '{"http": 500}')$$,
    'another relay cannot fail an event it does not lease'
);
SELECT results_eq(
    $$SELECT event_id, outcome
      FROM runrelay.fail_ledger('x', tests.eids('f1', ARRAY['a', 'b']), '{"http": 500}', retry_at => now() + interval '5 minutes')$$,
    $$SELECT tests.eid('f1', 'a'), 'retrying'$$,
    'fail: retrying, only for the events this relay leases'
);
SELECT results_eq(
    $$SELECT state, lease_owner, lease_expires_at, delivery_attempts, last_error, next_attempt_at, failed_at
      FROM runrelay.ledger WHERE event_id = tests.eid('f1', 'a')$$,
    $$VALUES ('pending', NULL::text, NULL::timestamptz, 1, '{"http": 500}'::jsonb, now() + interval '5 minutes', NULL::timestamptz)$$,
    'a retrying event is pending at retry_at with delivery_attempts + 1 and last_error'
);
SELECT is(tests.ev_state(tests.eid('f1', 'b')), 'pending', 'the event behind it is untouched');
SELECT runrelay.release_ledger('x', tests.eids('f1', ARRAY['a']));
SELECT set_config('runrelay.clock_offset', '6 minutes', TRUE);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f1');
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('f1', ARRAY['a']), '{"http": 502}')$$,
    $$VALUES ('retrying')$$,
    'without retry_at: retrying again'
);
SELECT results_eq(
    $$SELECT delivery_attempts, last_error, next_attempt_at > runrelay._now() FROM runrelay.ledger WHERE event_id = tests.eid('f1', 'a')$$,
    $$VALUES (2, '{"http": 502}'::jsonb, TRUE)$$,
    'the default retry time is a backoff in the future'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'f1')$$,
    'during the backoff the head is not claimable'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);

-- fail_ledger: blocked (permanent).
SELECT tests.ledger_run('f2');
SELECT tests.append('f2', ARRAY['a', 'b']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f2');
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('f2', ARRAY['a']), '{"http": 410}', permanent => TRUE)$$,
    $$VALUES ('blocked')$$,
    'a permanent failure blocks at once'
);
SELECT results_eq(
    $$SELECT state, lease_owner, delivery_attempts, last_error, failed_at IS NOT NULL
      FROM runrelay.ledger WHERE event_id = tests.eid('f2', 'a')$$,
    $$VALUES ('failed', NULL::text, 1, '{"http": 410}'::jsonb, TRUE)$$,
    'a blocked event is failed, with failed_at, delivery_attempts + 1 and last_error'
);
SELECT is(
    (
        SELECT blocked FROM runrelay.ledger_lanes
        WHERE run_id = 'f2' AND lane = 'lifecycle'
    ), TRUE,
    'its lane is blocked'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'f2')$$,
    'the lane stays blocked behind it'
);

-- fail_ledger: blocked (attempts exhausted).
UPDATE runrelay.settings SET ledger_max_delivery_attempts = 2;
SELECT tests.ledger_run('f3');
SELECT tests.append('f3', ARRAY['a']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f3');
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('f3', ARRAY['a']), '{"n": 1}', retry_at => now() - interval '1 second')$$,
    $$VALUES ('retrying')$$,
    'with ledger_max_delivery_attempts = 2 the first failure retries'
);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'f3');
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('f3', ARRAY['a']), '{"n": 2}', retry_at => now() - interval '1 second')$$,
    $$VALUES ('blocked')$$,
    'the second failure exhausts the attempts: blocked, even with a retry_at'
);
SELECT results_eq(
    $$SELECT state, delivery_attempts, last_error FROM runrelay.ledger WHERE event_id = tests.eid('f3', 'a')$$,
    $$VALUES ('failed', 2, '{"n": 2}'::jsonb)$$,
    'the exhausted event is failed after 2 attempts'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', run_id => 'f3')$$,
    'and blocks its lane'
);

SELECT * FROM finish();
ROLLBACK;
