-- skip_ledger_events: a lane's failed head ends as skipped (the reason and
-- the role kept on it), its successors are delivered in order; a lane
-- whose head is not failed answers not_blocked and changes nothing; a
-- repeated call_id answers the first reply and writes nothing, not_blocked
-- included (a head that failed since is not skipped by the repeat); bad input
-- is 22023 and changes nothing.
BEGIN;
SELECT plan(20);

SELECT tests.clear_runs();

CREATE FUNCTION pg_temp.block(p_run_id text)
RETURNS void
LANGUAGE sql
AS $$
    SELECT runrelay.fail_ledger('x', array_agg(c.event_id), '{"http": 410}', permanent => TRUE)
    FROM runrelay.claim_ledger(relay => 'x', lane => 'lifecycle', run_id => p_run_id) AS c;
$$;

SELECT tests.ledger_run('s1');
SELECT tests.append('s1', ARRAY['a1', 'a2', 'a3']);
SELECT pg_temp.block('s1');
SELECT is(
    (
        SELECT state FROM runrelay.ledger
        WHERE run_id = 's1' AND type = 'a1'
    ), 'failed', 'the head failed for good'
);
SELECT is(
    (SELECT count(*) FROM runrelay.claim_ledger(relay => 'r', run_id => 's1')), 0::bigint,
    'a blocked lane delivers nothing'
);

-- Bad input changes nothing.
CREATE TEMP TABLE before_bad AS SELECT tests.ledger_states('s1') AS states;
SELECT throws_ok($$SELECT * FROM runrelay.skip_ledger_events(NULL, 'lifecycle', 'r')$$, '22023', NULL, 'run_id null');
SELECT throws_ok($$SELECT * FROM runrelay.skip_ledger_events('s1', 'nope', 'r')$$, '22023', NULL, 'an unknown lane');
SELECT throws_ok(
    $$SELECT * FROM runrelay.skip_ledger_events('s1', 'lifecycle', repeat('x', 2001))$$, '22023', NULL,
    'a reason over 2000 characters'
);
SELECT is(tests.ledger_states('s1'), (SELECT states FROM before_bad), 'the refused calls changed nothing');

CREATE TEMP TABLE skip_call AS SELECT gen_random_uuid() AS id;
SELECT results_eq(
    $$SELECT s.seq, s.outcome FROM skip_call, runrelay.skip_ledger_events('s1', 'lifecycle', 'gone for good', skip_call.id) AS s$$,
    $$SELECT l.seq, 'skipped'::text FROM runrelay.ledger AS l WHERE l.run_id = 's1' AND l.type = 'a1'$$,
    'skipped: the failed head'
);
SELECT results_eq(
    $$SELECT state, skip_reason, skipped_by, failed_at FROM runrelay.ledger WHERE run_id = 's1' AND type = 'a1'$$,
    $$VALUES ('skipped', 'gone for good', session_user::text COLLATE "default", NULL::timestamptz)$$,
    'the event is skipped, with the reason and the role'
);
SELECT is(
    (
        SELECT last_error FROM runrelay.ledger
        WHERE run_id = 's1' AND type = 'a1'
    ), '{"http": 410}'::jsonb,
    'its last error is kept'
);
CREATE TEMP TABLE after_skip AS SELECT tests.ledger_states('s1') AS states;
SELECT results_eq(
    $$SELECT s.seq, s.outcome FROM skip_call, runrelay.skip_ledger_events('s1', 'lifecycle', 'gone for good', skip_call.id) AS s$$,
    $$SELECT l.seq, 'skipped'::text FROM runrelay.ledger AS l WHERE l.run_id = 's1' AND l.type = 'a1'$$,
    'a repeat with the same call_id answers the first reply'
);
SELECT is(tests.ledger_states('s1'), (SELECT states FROM after_skip), '... and writes nothing');
SELECT throws_ok(
    $$SELECT * FROM skip_call, runrelay.skip_ledger_events('s1', 'lifecycle', 'another reason', skip_call.id)$$,
    '22023', NULL, 'the same call_id with another reason is refused'
);
SELECT results_eq(
    $$SELECT type FROM runrelay.claim_ledger(relay => 'r', run_id => 's1') WHERE kind = 'claimed'$$,
    $$VALUES ('a2')$$,
    'the lane delivers the successor next'
);
SELECT results_eq(
    $$SELECT event_id IS NOT NULL, outcome FROM runrelay.skip_ledger_events('s1', 'lifecycle', 'again')$$,
    $$VALUES (TRUE, 'not_blocked')$$,
    'not_blocked: the head (leased, not failed) is named and left alone'
);
CREATE TEMP TABLE not_blocked_call AS SELECT gen_random_uuid() AS id;
SELECT results_eq(
    $$SELECT s.seq, s.outcome
      FROM not_blocked_call, runrelay.skip_ledger_events('s1', 'lifecycle', 'later', not_blocked_call.id) AS s$$,
    $$SELECT l.seq, 'not_blocked'::text FROM runrelay.ledger AS l WHERE l.run_id = 's1' AND l.type = 'a2'$$,
    'not_blocked with a call_id: the head it found'
);
SELECT runrelay.fail_ledger(
    'r', array(
        SELECT event_id FROM runrelay.ledger
        WHERE run_id = 's1' AND type = 'a2'
    ), '{}', permanent => TRUE
);
SELECT results_eq(
    $$SELECT s.seq, s.outcome
      FROM not_blocked_call, runrelay.skip_ledger_events('s1', 'lifecycle', 'later', not_blocked_call.id) AS s$$,
    $$SELECT l.seq, 'not_blocked'::text FROM runrelay.ledger AS l WHERE l.run_id = 's1' AND l.type = 'a2'$$,
    'its repeat answers not_blocked again after the head failed'
);
SELECT is(
    (
        SELECT state FROM runrelay.ledger
        WHERE run_id = 's1' AND type = 'a2'
    ), 'failed',
    '... and leaves the failed head alone'
);
SELECT results_eq(
    $$SELECT event_id, seq, outcome FROM runrelay.skip_ledger_events('nobody', 'observability', 'r')$$,
    $$VALUES (NULL::bigint, NULL::bigint, 'not_blocked')$$,
    'not_blocked: a lane with no events'
);
SELECT ok(
    runrelay.prune(now() + interval '1 day', 100) >= 1,
    'prune takes a skipped event like a delivered one'
);
SELECT ok(
    NOT EXISTS (
        SELECT FROM runrelay.ledger
        WHERE run_id = 's1' AND state = 'skipped'
    ),
    'the skipped event is gone after the prune'
);

SELECT * FROM finish();
ROLLBACK;
