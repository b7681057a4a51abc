-- enqueue_run (SPEC §3.1): creation, idempotent repeats, conflicting repeats,
-- the run.queued event, and concurrency keys (strictly serial, enqueue order,
-- a retrying run keeps the head).
BEGIN;
SELECT plan(29);

-- Creation.
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run(
        run_id => 'e1', queue => 'q-e1', payload => '{"n": 1}', priority => 7,
        max_attempts => 4, payload_retention => 'drop_on_delivery'
    )$$,
    $$VALUES ('e1', 'queued', TRUE)$$,
    'a new run_id is created: (run_id, queued, created = true)'
);
SELECT results_eq(
    $$SELECT queue, status, payload, priority, max_attempts, attempt_count, payload_retention,
             concurrency_key, wait, resume, result, error, finished_at
      FROM runrelay.runs WHERE run_id = 'e1'$$,
    $$VALUES ('q-e1', 'queued', '{"n": 1}'::jsonb, 7, 4, 0, 'drop_on_delivery',
              NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::timestamptz)$$,
    'the run row stores what was enqueued'
);
SELECT is(
    (
        SELECT run_at FROM runrelay.runs
        WHERE run_id = 'e1'
    ), now(),
    'run_at defaults to now()'
);
SELECT is(tests.lifecycle('e1'), ARRAY['run.queued'], 'enqueue emits exactly run.queued');
SELECT results_eq(
    $$SELECT lane, seq, transport_only, payload ->> 'queue' FROM runrelay.ledger WHERE run_id = 'e1'$$,
    $$VALUES ('lifecycle', 1::bigint, FALSE, 'q-e1')$$,
    'run.queued is the first lifecycle event, delivered (not transport-only), naming the queue'
);

-- Idempotent repeat.
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e1', queue => 'q-e1', payload => '{"n": 1}')$$,
    $$VALUES ('e1', 'queued', FALSE)$$,
    'the same run_id, queue and payload returns the existing run with created = false'
);
SELECT is(
    (
        SELECT max_attempts FROM runrelay.runs
        WHERE run_id = 'e1'
    ), 4,
    'a repeat does not overwrite the existing run (max_attempts kept)'
);
SELECT is(tests.event_count('e1'), 1::bigint, 'a repeat emits no second run.queued');

-- Conflicting repeats raise and change nothing.
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e1', queue => 'q-e1', payload => '{"n": 2}')$$,
    '22023', NULL, 'the same run_id with a different payload raises 22023'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e1', queue => 'other', payload => '{"n": 1}')$$,
    '22023', NULL, 'the same run_id on a different queue raises 22023'
);
SELECT results_eq(
    $$SELECT queue, payload, status FROM runrelay.runs WHERE run_id = 'e1'$$,
    $$VALUES ('q-e1', '{"n": 1}'::jsonb, 'queued')$$,
    'a conflicting enqueue leaves the run unchanged'
);
SELECT is(tests.event_count('e1'), 1::bigint, 'a conflicting enqueue emits nothing');

-- A repeat reports the run's current status.
SELECT tests.start_run('e2');
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e2', queue => 'e2')$$,
    $$VALUES ('e2', 'running', FALSE)$$,
    'a repeat of a running run reports status running, created = false'
);
SELECT is(
    runrelay.complete_attempt('e2', 1, tests.token('e2')), 'completed', 'fixture: e2 completes'
);
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e2', queue => 'e2')$$,
    $$VALUES ('e2', 'completed', FALSE)$$,
    'a repeat of a finished run returns it (completed), it does not start it again'
);
SELECT is(tests.state('e2'), 'completed:completed', 'the finished run is untouched by the repeat');

-- Explicit run_at in the future and in the past.
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run(run_id => 'e3', queue => 'q-e3', run_at => now() + interval '1 hour')$$,
    $$VALUES ('e3', 'queued', TRUE)$$,
    'a run can be enqueued for later'
);
SELECT is(
    (
        SELECT run_at FROM runrelay.runs
        WHERE run_id = 'e3'
    ), now() + interval '1 hour',
    'run_at is stored as given'
);

-- Concurrency keys: strictly serial, in enqueue order.
SELECT runrelay.enqueue_run(run_id => 'k-a', queue => 'q-key', concurrency_key => 'key1');
SELECT runrelay.enqueue_run(run_id => 'k-b', queue => 'q-key', concurrency_key => 'key1', priority => 100);
SELECT runrelay.enqueue_run(run_id => 'k-other', queue => 'q-key', concurrency_key => 'key2');
SELECT set_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-key'], max_runs => 10)$$,
    ARRAY['k-a', 'k-other'],
    'one run per key is claimable: the key''s first-enqueued run, whatever the priority of later ones'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-key'], max_runs => 10)$$,
    'while the key''s head is running, its next run is not claimable'
);
SELECT is(
    runrelay.fail_attempt('k-a', 1, tests.token('k-a'), '{"e": 1}', retry_at => now()),
    'retry_scheduled', 'fixture: the key''s head fails and retries'
);
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-key'], max_runs => 10)$$,
    $$VALUES ('k-a', 2)$$,
    'a retrying run keeps its place at the head of its key: it is claimed again, not the next run'
);
SELECT is(
    runrelay.complete_attempt('k-a', 2, tests.token('k-a', 2)), 'completed', 'fixture: the head completes'
);
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-key'], max_runs => 10)$$,
    $$VALUES ('k-b', 1)$$,
    'when the key''s head ends, the next run of the key becomes claimable'
);

-- A key whose head waits still blocks the key.
SELECT runrelay.enqueue_run(run_id => 'kw-a', queue => 'q-kw', concurrency_key => 'key3');
SELECT runrelay.enqueue_run(run_id => 'kw-b', queue => 'q-kw', concurrency_key => 'key3');
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-kw'], max_runs => 10)$$,
    $$VALUES ('kw-a')$$,
    'fixture: the first run of key3 is claimed alone'
);
SELECT is(
    runrelay.suspend_attempt('kw-a', 1, tests.token('kw-a'), '{"kind": "event", "name": "go"}'),
    'waiting', 'fixture: the head of key3 waits'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-kw'], max_runs => 10)$$,
    'a waiting head still holds its key: the next run is not claimable'
);
SELECT is(runrelay.cancel_run('kw-a'), 'cancelled', 'fixture: the waiting head is cancelled');
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-kw'], max_runs => 10)$$,
    $$VALUES ('kw-b')$$,
    'a cancelled head releases its key to the next run'
);

SELECT * FROM finish();
ROLLBACK;
