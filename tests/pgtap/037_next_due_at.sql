-- ledger_next_due_at (SPEC §3.3): the earliest moment claimable ledger work
-- exists; null when nothing is pending; a live lease counts at its expiry; a
-- retrying head at its retry time; blocked lanes are not due, transport-only
-- heads are; lane and run_id filters.
BEGIN;
SELECT plan(17);

-- Installation-wide answers: start from an empty ledger.
SELECT tests.clear_runs();
SELECT is(runrelay.ledger_next_due_at(), NULL, 'null when there is no ledger at all');
SELECT tests.ledger_run('r1');
SELECT is(runrelay.ledger_next_due_at(), NULL, 'null when every event is delivered');
SELECT is(runrelay.ledger_next_due_at(run_id => 'no-such-run'), NULL, 'null for an unknown run');

-- A pending event is due since its creation.
SELECT set_config('runrelay.clock_offset', '-10 minutes', TRUE);
SELECT tests.append('r1', ARRAY['obs'], 'observability');
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT is(
    runrelay.ledger_next_due_at(),
    (
        SELECT created_at FROM runrelay.ledger
        WHERE event_id = tests.eid('r1', 'obs')
    ),
    'a pending event is due at its creation'
);
SELECT is(runrelay.ledger_next_due_at(lane => 'lifecycle'), NULL, 'the lane filter: nothing pending on lifecycle');
SELECT is(
    runrelay.ledger_next_due_at(lane => 'observability', run_id => 'r1'),
    (
        SELECT created_at FROM runrelay.ledger
        WHERE event_id = tests.eid('r1', 'obs')
    ),
    'lane and run_id filters together'
);

-- A live lease counts as due at its expiry.
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'r1', lease_seconds => 60);
SELECT is(
    runrelay.ledger_next_due_at(run_id => 'r1'),
    (
        SELECT lease_expires_at FROM runrelay.ledger
        WHERE event_id = tests.eid('r1', 'obs')
    ),
    'a leased head is due at its lease expiry'
);

-- A retrying head at its retry time.
SELECT tests.ledger_run('r2');
SELECT tests.append('r2', ARRAY['a']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'r2');
SELECT runrelay.fail_ledger('x', tests.eids('r2', ARRAY['a']), '{}', retry_at => now() + interval '20 minutes');
SELECT is(runrelay.ledger_next_due_at(run_id => 'r2'), now() + interval '20 minutes', 'a retrying head is due at its retry time');
SELECT is(runrelay.ledger_next_due_at(lane => 'lifecycle'), now() + interval '20 minutes', 'the only lifecycle work is due then');
SELECT is(
    runrelay.ledger_next_due_at(),
    (
        SELECT lease_expires_at FROM runrelay.ledger
        WHERE event_id = tests.eid('r1', 'obs')
    ),
    'without filters, the earliest over all runs and lanes (the 60 s lease)'
);

-- A blocked lane is not due, even with events behind its head.
SELECT tests.ledger_run('r3');
SELECT tests.append('r3', ARRAY['a', 'b']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'r3');
SELECT runrelay.fail_ledger('x', tests.eids('r3', ARRAY['a']), '{}', permanent => TRUE);
SELECT is(runrelay.ledger_next_due_at(run_id => 'r3'), NULL, 'a blocked lane is not due');
SELECT is(runrelay.ledger_next_due_at(lane => 'lifecycle'), now() + interval '20 minutes', 'and it does not affect the global answer');
SELECT runrelay.requeue_ledger_event(tests.eid('r3', 'a'));
SELECT cmp_ok(runrelay.ledger_next_due_at(run_id => 'r3'), '<=', statement_timestamp(), 'a requeued head is due now');

-- A transport-only head is due like any head, successor or not: the claim
-- that comes for it acknowledges it locally.
SELECT tests.ledger_run('r4');
SELECT tests.append('r4', ARRAY['t'], 'lifecycle', TRUE);
SELECT is(
    runrelay.ledger_next_due_at(run_id => 'r4'),
    (
        SELECT created_at FROM runrelay.ledger
        WHERE event_id = tests.eid('r4', 't')
    ),
    'a lone transport-only head is due from its creation'
);
SELECT tests.append('r4', ARRAY['a']);
SELECT cmp_ok(
    runrelay.ledger_next_due_at(run_id => 'r4'), '<=', statement_timestamp(),
    'with a successor it is still due'
);

-- Everything delivered again: null.
SELECT runrelay.ack_ledger(relay => 'x', run_id => 'r1', event_ids => tests.eids('r1', ARRAY['obs']));
SELECT is(runrelay.ledger_next_due_at(run_id => 'r1'), NULL, 'null again once the run''s events are delivered');
SELECT is(runrelay.ledger_next_due_at(lane => 'observability'), NULL, 'and its lane has nothing pending');

SELECT * FROM finish();
ROLLBACK;
