-- get_run, run_attempts, run_ledger_events (docs/admin.md): one run with
-- every column and its pending cancellation; its attempts in order with
-- their errors and outcomes, a page at a time; its ledger events in seq
-- order with their delivery state per lane, a page at a time; no row for
-- an unknown run; 22023 for bad input.
BEGIN;
SELECT plan(31);

-- A run that failed once (retry scheduled), then was claimed again.
SELECT tests.start_run('i1');
SELECT runrelay.fail_attempt('i1', 1, tests.token('i1'), '{"why": "timeout"}', retry_at => now() - interval '1 second');
SELECT tests.claim_run('i1', 'w2');

-- get_run.
SELECT results_eq(
    $$SELECT run_id, queue, status, attempt_count, max_attempts, error, payload, payload_retention,
             finished_at, cancel_requested, cancel_reason
      FROM runrelay.get_run('i1')$$,
    $$VALUES ('i1', 'i1', 'running', 2, 3, '{"why": "timeout"}'::jsonb, '{}'::jsonb, 'keep',
              NULL::timestamptz, FALSE, NULL::text)$$,
    'get_run: the run with every column'
);
SELECT is((SELECT count(*) FROM runrelay.get_run('nobody')), 0::bigint, 'get_run: no row for an unknown run');
SELECT tests.mark_cancel('i1', 'operator said so');
SELECT results_eq(
    $$SELECT status, cancel_requested, cancel_reason FROM runrelay.get_run('i1')$$,
    $$VALUES ('running', TRUE, 'operator said so')$$,
    'get_run: a pending cancellation and its reason'
);
SELECT runrelay.enqueue_run('c1');
SELECT is(runrelay.cancel_run('c1', 'duplicate order'), 'cancelled', 'cancel_run: a queued run is cancelled at once');
SELECT results_eq(
    $$SELECT status, cancel_requested, cancel_reason FROM runrelay.get_run('c1')$$,
    $$VALUES ('cancelled', FALSE, 'duplicate order')$$,
    'get_run: a cancelled run keeps the reason it was cancelled for, after its marker is gone'
);
SELECT tests.start_waiting('i2', '{"kind": "event", "name": "go", "timeout_at": "2100-01-01T00:00:00Z"}');
SELECT results_eq(
    $$SELECT status, wait, wake_at FROM runrelay.get_run('i2')$$,
    $$VALUES ('waiting', '{"kind": "event", "name": "go", "timeout_at": "2100-01-01T00:00:00+00:00"}'::jsonb,
              '2100-01-01T00:00:00Z'::timestamptz)$$,
    'get_run: a waiting run with its wait and wake-up time'
);

-- run_attempts.
SELECT results_eq(
    $$SELECT attempt, worker, status, outcome, error, finished_at IS NOT NULL, lease_expires_at IS NOT NULL
      FROM runrelay.run_attempts('i1')$$,
    $$VALUES (1, 'w1', 'failed', 'retry_scheduled', '{"why": "timeout"}'::jsonb, TRUE, TRUE),
             (2, 'w2', 'running', NULL, NULL::jsonb, FALSE, TRUE)$$,
    'run_attempts: every attempt in order, with its worker, outcome and error'
);
SELECT results_eq(
    $$SELECT attempt FROM runrelay.run_attempts('i1', max_rows => 1)$$,
    $$VALUES (1)$$,
    'run_attempts: max_rows bounds the page'
);
SELECT results_eq(
    $$SELECT attempt FROM runrelay.run_attempts('i1', after_attempt => 1)$$,
    $$VALUES (2)$$,
    'run_attempts: the page after attempt 1'
);
SELECT is((SELECT count(*) FROM runrelay.run_attempts('i1', after_attempt => 2)), 0::bigint, 'run_attempts: past the last');
SELECT results_eq(
    $$SELECT status, wait FROM runrelay.run_attempts('i2')$$,
    $$VALUES ('waiting', '{"kind": "event", "name": "go", "timeout_at": "2100-01-01T00:00:00+00:00"}'::jsonb)$$,
    'run_attempts: a waiting attempt with its wait'
);
SELECT runrelay.enqueue_run('i3', 'i3');
SELECT is((SELECT count(*) FROM runrelay.run_attempts('i3')), 0::bigint, 'run_attempts: none for a run never claimed');
SELECT is((SELECT count(*) FROM runrelay.run_attempts('nobody')), 0::bigint, 'run_attempts: none for an unknown run');

-- run_ledger_events: both lanes in seq order, each event's state.
SELECT tests.ledger_run('e1');
SELECT tests.append('e1', ARRAY['a', 'b', 'c']);
SELECT tests.append('e1', ARRAY['o1', 'o2'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'e1');
SELECT runrelay.fail_ledger('x', tests.eids('e1', ARRAY['a']), '{"http": 500}');
SELECT runrelay.claim_ledger(relay => 'y', lane => 'observability', run_id => 'e1');
SELECT results_eq(
    $$SELECT lane, type, state, lease_owner, delivery_attempts, last_error, delivered_by
      FROM runrelay.run_ledger_events('e1')$$,
    $$VALUES ('lifecycle', 'run.queued', 'delivered', NULL, 0, NULL::jsonb, 'fixture'),
             ('lifecycle', 'a', 'pending', NULL, 1, '{"http": 500}'::jsonb, NULL),
             ('lifecycle', 'b', 'pending', NULL, 0, NULL::jsonb, NULL),
             ('lifecycle', 'c', 'pending', NULL, 0, NULL::jsonb, NULL),
             ('observability', 'o1', 'leased', 'y', 0, NULL::jsonb, NULL),
             ('observability', 'o2', 'pending', NULL, 0, NULL::jsonb, NULL)$$,
    'run_ledger_events: every event of both lanes in seq order, with its delivery state'
);
SELECT is(
    array(SELECT e.seq FROM runrelay.run_ledger_events('e1') AS e),
    array(
        SELECT l.seq FROM runrelay.ledger AS l
        WHERE l.run_id = 'e1'
        ORDER BY l.seq
    ),
    'run_ledger_events: seq ascending'
);
SELECT is(
    array(SELECT e.type FROM runrelay.run_ledger_events('e1', lane => 'observability') AS e),
    ARRAY['o1', 'o2'],
    'run_ledger_events: one lane'
);
SELECT is(
    array(SELECT e.type FROM runrelay.run_ledger_events('e1', max_rows => 2) AS e),
    ARRAY['run.queued', 'a'],
    'run_ledger_events: max_rows bounds the page, across lanes'
);
SELECT is(
    array(
        SELECT e.type FROM runrelay.run_ledger_events(
            'e1', after_seq => (
                SELECT l.seq FROM runrelay.ledger AS l
                WHERE l.event_id = tests.eid('e1', 'c')
            ), max_rows => 2
        ) AS e
    ),
    ARRAY['o1', 'o2'],
    'run_ledger_events: the page after an event'
);
SELECT runrelay.fail_ledger('y', tests.eids('e1', ARRAY['o1']), '{"http": 410}', permanent => TRUE);
SELECT results_eq(
    $$SELECT type, state, failed_at IS NOT NULL, last_error
      FROM runrelay.run_ledger_events('e1', lane => 'observability')$$,
    $$VALUES ('o1', 'failed', TRUE, '{"http": 410}'::jsonb), ('o2', 'pending', FALSE, NULL::jsonb)$$,
    'run_ledger_events: a failed event blocks its lane'
);
SELECT is((SELECT count(*) FROM runrelay.run_ledger_events('nobody')), 0::bigint, 'run_ledger_events: none for an unknown run');

-- Bad input.
SELECT throws_ok($$SELECT * FROM runrelay.get_run(NULL)$$, '22023', NULL, 'get_run: null run_id');
SELECT throws_ok($$SELECT * FROM runrelay.get_run(' ')$$, '22023', NULL, 'get_run: blank run_id');
SELECT throws_ok($$SELECT * FROM runrelay.run_attempts('')$$, '22023', NULL, 'run_attempts: empty run_id');
SELECT throws_ok($$SELECT * FROM runrelay.run_attempts('i1', after_attempt => -1)$$, '22023', NULL, 'run_attempts: negative after_attempt');
SELECT throws_ok($$SELECT * FROM runrelay.run_attempts('i1', max_rows => 0)$$, '22023', NULL, 'run_attempts: max_rows 0');
SELECT throws_ok($$SELECT * FROM runrelay.run_attempts('i1', max_rows => 1001)$$, '22023', NULL, 'run_attempts: max_rows 1001');
SELECT throws_ok($$SELECT * FROM runrelay.run_ledger_events(repeat('r', 201))$$, '22023', NULL, 'run_ledger_events: long run_id');
SELECT throws_ok($$SELECT * FROM runrelay.run_ledger_events('e1', lane => 'audit')$$, '22023', NULL, 'run_ledger_events: unknown lane');
SELECT throws_ok(
    $$SELECT * FROM runrelay.run_ledger_events('e1', after_seq => -1)$$, '22023', NULL, 'run_ledger_events: negative after_seq'
);
SELECT throws_ok($$SELECT * FROM runrelay.run_ledger_events('e1', after_seq => NULL)$$, '22023', NULL, 'run_ledger_events: null after_seq');
SELECT throws_ok($$SELECT * FROM runrelay.run_ledger_events('e1', max_rows => NULL)$$, '22023', NULL, 'run_ledger_events: null max_rows');

SELECT * FROM finish();
ROLLBACK;
