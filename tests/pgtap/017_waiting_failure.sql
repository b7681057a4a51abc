-- prepare_waiting_failure and fail_attempt(..., protect_waiting_suspension)
-- (SPEC §3.2): prepared, fence_lost, not_applicable; preparing never clears
-- the wait nor emits run.resumed; a signal, a timeout or a cancellation that
-- arrives after the prepare still wins; a replayed prepare writes nothing; a
-- protected failure needs the attempt's receipt to be the suspension in force.
BEGIN;
SELECT plan(41);

-- not_applicable.
SELECT tests.start_run('w-run');
SELECT is(
    runrelay.prepare_waiting_failure('w-run', 1, tests.token('w-run')), 'not_applicable',
    'a running run: not_applicable'
);
SELECT runrelay.enqueue_run(run_id => 'w-queued', queue => 'q-w-queued');
SELECT is(
    runrelay.prepare_waiting_failure('w-queued', 1, gen_random_uuid()), 'not_applicable',
    'a queued run: not_applicable'
);
SELECT tests.start_waiting('w-det', '{"kind": "detached_runner", "runner": "r"}');
SELECT is(
    runrelay.prepare_waiting_failure('w-det', 1, tests.token('w-det')), 'not_applicable',
    'a run waiting on a detached runner: not_applicable'
);
SELECT is(tests.state('w-det'), 'waiting:waiting', 'not_applicable changes nothing');
SELECT tests.start_run('w-done');
SELECT runrelay.complete_attempt('w-done', 1, tests.token('w-done'));
SELECT is(
    runrelay.prepare_waiting_failure('w-done', 1, tests.token('w-done')), 'not_applicable',
    'a completed run: not_applicable'
);

-- prepared.
SELECT tests.start_waiting('w1', '{"kind": "event", "name": "go"}', 2);
SELECT is(
    runrelay.prepare_waiting_failure('w1', 1, gen_random_uuid()), 'fence_lost', 'a wrong token: fence_lost'
);
SELECT is(
    runrelay.prepare_waiting_failure('w1', 2, tests.token('w1')), 'fence_lost', 'an attempt that does not exist: fence_lost'
);
SELECT is(tests.state('w1'), 'waiting:waiting', 'fence_lost changes nothing');
SELECT is(
    runrelay.prepare_waiting_failure('w1', 1, tests.token('w1')), 'prepared',
    'the waiting attempt with its token: prepared'
);
SELECT results_eq(
    $$SELECT r.status, r.wait, a.status, a.lease_expires_at - a.heartbeat_at
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'w1'$$,
    $$VALUES ('waiting', '{"kind": "event", "name": "go"}'::jsonb, 'running', interval '30 seconds')$$,
    'preparing sets the attempt back to running (with a lease) and keeps the run waiting on the same wait'
);
SELECT is(
    tests.lifecycle('w1'), ARRAY['run.queued', 'run.started', 'run.waiting'], 'preparing emits no run.resumed'
);
-- The replay comes a minute later, so a refreshed lease or heartbeat would show.
CREATE TEMP TABLE w1_before AS
SELECT
    (
        SELECT a::text FROM runrelay.attempts AS a
        WHERE a.run_id = 'w1'
    ) AS attempt_row,
    (
        SELECT r::text FROM runrelay.runs AS r
        WHERE r.run_id = 'w1'
    ) AS run_row,
    (
        SELECT array_agg(l::text ORDER BY l.seq) FROM runrelay.ledger AS l
        WHERE l.run_id = 'w1'
    ) AS ledger_rows;
SELECT tests.set_clock('1 minute');
SELECT is(
    runrelay.prepare_waiting_failure('w1', 1, tests.token('w1')), 'prepared', 'a replayed prepare answers prepared'
);
SELECT results_eq(
    $$SELECT
        (SELECT a::text FROM runrelay.attempts AS a WHERE a.run_id = 'w1'),
        (SELECT r::text FROM runrelay.runs AS r WHERE r.run_id = 'w1'),
        (SELECT array_agg(l::text ORDER BY l.seq) FROM runrelay.ledger AS l WHERE l.run_id = 'w1')$$,
    $$SELECT attempt_row, run_row, ledger_rows FROM w1_before$$,
    'the replay changes nothing: attempt (lease, heartbeat), run and ledger rows are byte-identical'
);
SELECT tests.set_clock('0');
SELECT is(tests.event_count('w1'), 3::bigint, 'the replay emits nothing');
SELECT is(
    runrelay.fail_attempt('w1', 1, gen_random_uuid(), '{}', protect_waiting_suspension => TRUE), 'fence_lost',
    'a protected failure with a wrong token: fence_lost'
);
SELECT is(
    runrelay.fail_attempt('w1', 1, tests.token('w1'), '{"why": "gave up"}', protect_waiting_suspension => TRUE),
    'retry_scheduled', 'the protected failure of a prepared attempt applies: retry_scheduled'
);
SELECT results_eq(
    $$SELECT r.status, r.wait, r.error, a.status FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'w1'$$,
    $$VALUES ('queued', NULL::jsonb, '{"why": "gave up"}'::jsonb, 'failed')$$,
    'the wait is cleared, the run queued for retry, the attempt failed'
);
SELECT is(
    tests.lifecycle('w1'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.retry_scheduled'],
    'the protected failure emits run.retry_scheduled (no run.resumed)'
);
SELECT is(
    runrelay.fail_attempt('w1', 1, tests.token('w1'), '{"why": "gave up"}', protect_waiting_suspension => TRUE),
    'retry_scheduled', 'a replayed protected failure answers retry_scheduled'
);
SELECT is(tests.event_count('w1'), 4::bigint, 'the replay emits nothing');

-- Exhausted attempts: failed.
SELECT tests.start_waiting('w2', '{"kind": "sleep", "until": "2999-01-01T00:00:00Z"}', 1);
SELECT is(
    runrelay.prepare_waiting_failure('w2', 1, tests.token('w2')), 'prepared', 'a sleeping run can be prepared'
);
SELECT is(
    runrelay.fail_attempt('w2', 1, tests.token('w2'), '{}', protect_waiting_suspension => TRUE), 'failed',
    'the protected failure of the last allowed attempt: failed'
);
SELECT is(tests.state('w2'), 'failed:failed', 'the waiting run is failed');

-- Without a prepare the protected failure is fenced.
SELECT tests.start_waiting('w3', '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.fail_attempt('w3', 1, tests.token('w3'), '{}', protect_waiting_suspension => TRUE), 'fence_lost',
    'a protected failure of an unprepared waiting attempt: fence_lost'
);
SELECT is(tests.state('w3'), 'waiting:waiting', 'and the run keeps waiting');

-- A signal after the prepare wins.
SELECT is(runrelay.prepare_waiting_failure('w3', 1, tests.token('w3')), 'prepared', 'fixture: w3 prepared');
SELECT is(runrelay.signal_run('w3', 'go', '{"v": 1}'), 'resumed', 'a signal after the prepare still resumes the run');
SELECT is(
    runrelay.fail_attempt('w3', 1, tests.token('w3'), '{}', protect_waiting_suspension => TRUE), 'fence_lost',
    'the protected failure after the signal: fence_lost'
);
SELECT results_eq(
    $$SELECT status, resume, error FROM runrelay.runs WHERE run_id = 'w3'$$,
    $$VALUES ('queued', '{"name": "go", "payload": {"v": 1}}'::jsonb, NULL::jsonb)$$,
    'the signal''s resume stands; no error is written'
);

-- A timeout after the prepare wins.
SELECT tests.start_waiting(
    'w4', jsonb_build_object('kind', 'event', 'name', 'go', 'timeout_at', now() + interval '1 minute')
);
SELECT is(runrelay.prepare_waiting_failure('w4', 1, tests.token('w4')), 'prepared', 'fixture: w4 prepared');
SELECT tests.set_clock('2 minutes');
SELECT results_eq(
    $$SELECT attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['w4'])$$,
    $$VALUES (2, '{"timed_out": true}'::jsonb)$$,
    'preparing does not disarm the timeout: the next claim wakes the run with {"timed_out": true}'
);
SELECT is(
    runrelay.fail_attempt('w4', 1, tests.token('w4'), '{}', protect_waiting_suspension => TRUE), 'fence_lost',
    'the protected failure after the timeout: fence_lost'
);
SELECT tests.set_clock('0');

-- A newer attempt waiting on an equal wait: the old attempt is fenced.
SELECT tests.start_waiting('w5', '{"kind": "event", "name": "go"}');
SELECT runrelay.signal_run('w5', 'go');
SELECT tests.claim_run('w5');
SELECT runrelay.suspend_attempt('w5', 2, tests.token('w5', 2), '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.prepare_waiting_failure('w5', 1, tests.token('w5', 1)), 'fence_lost',
    'preparing an older attempt while a newer one waits on the same wait: fence_lost'
);

-- A cancel marker.
SELECT tests.start_waiting('w6', '{"kind": "event", "name": "go"}');
SELECT tests.mark_cancel('w6');
SELECT is(
    runrelay.prepare_waiting_failure('w6', 1, tests.token('w6')), 'fence_lost', 'a pending cancel marker: fence_lost'
);
SELECT is(
    (
        SELECT status FROM runrelay.attempts
        WHERE run_id = 'w6'
    ), 'waiting', 'the attempt is not prepared'
);
SELECT tests.start_waiting('w7', '{"kind": "event", "name": "go"}');
SELECT runrelay.prepare_waiting_failure('w7', 1, tests.token('w7'));
SELECT tests.mark_cancel('w7');
SELECT is(
    runrelay.fail_attempt('w7', 1, tests.token('w7'), '{}', protect_waiting_suspension => TRUE), 'cancelled',
    'a marker written after the prepare wins over the protected failure: cancelled'
);
SELECT is(tests.state('w7'), 'cancelled:cancelled', 'the run ends cancelled, not failed');
SELECT is(
    tests.lifecycle('w7'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.cancelled'],
    'run.cancelled is emitted, no run.retry_scheduled'
);

-- The receipt is part of the suspension in force: an attempt whose receipt
-- no longer records the wait the run is in cannot be prepared, and its
-- protected failure is refused. (No API call rewrites a non-detached receipt;
-- the row is edited directly to isolate the rule.)
SELECT tests.start_waiting('w8', '{"kind": "event", "name": "go"}');
SELECT is(runrelay.prepare_waiting_failure('w8', 1, tests.token('w8')), 'prepared', 'fixture: w8 prepared');
UPDATE runrelay.attempts SET runner_result = '{"status": "something else"}'
WHERE run_id = 'w8';
SELECT is(
    runrelay.fail_attempt('w8', 1, tests.token('w8'), '{}', protect_waiting_suspension => TRUE), 'fence_lost',
    'a protected failure whose receipt is not the suspension in force: fence_lost'
);
SELECT is(tests.state('w8'), 'waiting:running', 'and the run keeps waiting');

SELECT * FROM finish();
ROLLBACK;
