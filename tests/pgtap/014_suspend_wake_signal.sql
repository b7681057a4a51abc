-- suspend_attempt and signal_run (SPEC §3.1, §3.2): waiting on sleep and
-- event waits, the suspension receipt, resumed by a signal (now or already
-- stored), stored signals consumed oldest first, terminal and not_found,
-- cancelled and fence_lost, replays, and the lifecycle events of a wait.
BEGIN;
SELECT plan(44);

-- Suspend on a sleep.
SELECT tests.start_run('s1');
SELECT is(
    runrelay.suspend_attempt(
        's1', 1, tests.token('s1'), jsonb_build_object('kind', 'sleep', 'until', now() + interval '1 hour'),
        '[{"type": "app.before_sleep"}]'
    ),
    'waiting', 'suspend_attempt on a sleep answers waiting'
);
SELECT results_eq(
    $$SELECT r.status, r.wait ->> 'kind', (r.wait ->> 'until')::timestamptz, a.status,
             a.runner_result ->> 'status', a.runner_result -> 'wait' = r.wait
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 's1'$$,
    $$VALUES ('waiting', 'sleep', now() + interval '1 hour', 'waiting', 'suspended', TRUE)$$,
    'the run waits on the sleep; the attempt waits and keeps {"status":"suspended","wait":...} as its receipt'
);
SELECT is(
    tests.lifecycle('s1'), ARRAY['run.queued', 'run.started', 'app.before_sleep', 'run.waiting'],
    'final_events come before run.waiting'
);
SELECT is(
    (
        SELECT transport_only FROM runrelay.ledger
        WHERE run_id = 's1' AND type = 'run.waiting'
    ), FALSE,
    'run.waiting of a sleep is delivered (not transport-only)'
);
SELECT is(
    runrelay.suspend_attempt('s1', 1, tests.token('s1'), jsonb_build_object('kind', 'sleep', 'until', now() + interval '1 hour')),
    'waiting', 'a replayed suspend answers waiting again'
);
SELECT is(tests.event_count('s1'), 4::bigint, 'the replay emits nothing');
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('s1', 1, tests.token('s1'))), 'fence_lost',
    'a suspended attempt no longer heartbeats (fence_lost)'
);
SELECT is(
    runrelay.fail_attempt('s1', 1, tests.token('s1'), '{}'), 'fence_lost',
    'a suspended attempt cannot be failed without prepare_waiting_failure (fence_lost)'
);
SELECT is(runrelay.signal_run('s1', 'go'), 'stored', 'a signal to a run sleeping (not waiting for it) is stored');
SELECT is(tests.state('s1'), 'waiting:waiting', 'a stored signal does not wake a sleep');

-- suspend_attempt: fence_lost.
SELECT tests.start_run('s2');
SELECT is(
    runrelay.suspend_attempt('s2', 1, gen_random_uuid(), '{"kind": "event", "name": "go"}'), 'fence_lost',
    'suspend with a wrong token answers fence_lost'
);
SELECT is(
    runrelay.suspend_attempt('s2', 2, tests.token('s2'), '{"kind": "event", "name": "go"}'), 'fence_lost',
    'suspend of an attempt that does not exist answers fence_lost'
);
SELECT is(
    runrelay.suspend_attempt('s-none', 1, tests.token('s2'), '{"kind": "event", "name": "go"}'), 'fence_lost',
    'suspend of a run that does not exist answers fence_lost'
);
SELECT is(tests.state('s2'), 'running:running', 'fenced-out suspends change nothing');

-- Event wait resumed by a signal.
SELECT is(
    runrelay.suspend_attempt('s2', 1, tests.token('s2'), '{"kind": "event", "name": "go"}'), 'waiting',
    'suspend_attempt on an event answers waiting'
);
SELECT is(runrelay.signal_run('s2', 'other', '{"p": 0}'), 'stored', 'a signal with another name is stored');
SELECT is(tests.state('s2'), 'waiting:waiting', 'a signal with another name does not wake the run');
SELECT is(runrelay.signal_run('s2', 'go', '{"p": 1}'), 'resumed', 'the awaited signal answers resumed');
SELECT results_eq(
    $$SELECT status, wait, resume, run_at <= statement_timestamp() FROM runrelay.runs WHERE run_id = 's2'$$,
    $$VALUES ('queued', NULL::jsonb, '{"name": "go", "payload": {"p": 1}}'::jsonb, TRUE)$$,
    'the run is queued again at once with resume = {name, payload} and no wait'
);
SELECT is(tests.state('s2'), 'queued:resumed', 'the waiting attempt is resumed');
SELECT is(
    tests.lifecycle('s2'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.resumed'],
    'signal_run emits run.resumed'
);
SELECT is(
    (
        SELECT bool_or(transport_only) FROM runrelay.ledger
        WHERE run_id = 's2'
    ), FALSE,
    'an event wait''s run.waiting / run.resumed are delivered (not transport-only)'
);
SELECT results_eq(
    $$SELECT attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['s2'])$$,
    $$VALUES (2, '{"name": "go", "payload": {"p": 1}}'::jsonb)$$,
    'the next attempt receives the resume'
);
SELECT is(
    runrelay.suspend_attempt('s2', 1, tests.token('s2', 1), '{"kind": "event", "name": "go"}'), 'waiting',
    'attempt 1''s suspend replayed after the run moved on answers what it recorded'
);
SELECT is(tests.state('s2'), 'running:resumed,running', 'that replay changes nothing');

-- A signal stored before the wait: suspend answers resumed.
SELECT is(
    runrelay.suspend_attempt('s2', 2, tests.token('s2', 2), '{"kind": "event", "name": "other"}'), 'resumed',
    'suspend on an event whose signal is already stored answers resumed'
);
SELECT results_eq(
    $$SELECT status, wait, resume FROM runrelay.runs WHERE run_id = 's2'$$,
    $$VALUES ('queued', NULL::jsonb, '{"name": "other", "payload": {"p": 0}}'::jsonb)$$,
    'the run is queued at once with the stored signal as resume'
);
SELECT is(
    (
        SELECT runner_result ->> 'status' FROM runrelay.attempts
        WHERE run_id = 's2' AND attempt = 2
    ), 'suspended',
    'the resumed attempt still keeps its suspension receipt'
);
SELECT is(
    tests.lifecycle('s2'),
    ARRAY['run.queued', 'run.started', 'run.waiting', 'run.resumed', 'run.started', 'run.waiting', 'run.resumed'],
    'an immediately resumed suspend emits run.waiting then run.resumed'
);
SELECT is(
    runrelay.suspend_attempt('s2', 2, tests.token('s2', 2), '{"kind": "event", "name": "other"}'), 'resumed',
    'a replayed suspend that resumed answers resumed again'
);
SELECT is(tests.event_count('s2'), 7::bigint, 'the replay emits nothing and consumes nothing');

-- Stored signals are consumed one each, oldest first.
SELECT tests.start_run('s3');
SELECT runrelay.signal_run('s3', 'tick', '{"n": 1}');
SELECT runrelay.signal_run('s3', 'tick', '{"n": 2}');
SELECT runrelay.suspend_attempt('s3', 1, tests.token('s3'), '{"kind": "event", "name": "tick"}');
SELECT tests.claim_run('s3');
SELECT runrelay.suspend_attempt('s3', 2, tests.token('s3', 2), '{"kind": "event", "name": "tick"}');
SELECT results_eq(
    $$SELECT attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['s3'])$$,
    $$VALUES (3, '{"name": "tick", "payload": {"n": 2}}'::jsonb)$$,
    'the second wait consumed the second stored signal (the first was consumed by the first wait)'
);
SELECT is(
    runrelay.suspend_attempt('s3', 3, tests.token('s3', 3), '{"kind": "event", "name": "tick"}'), 'waiting',
    'with every stored signal consumed, the next wait waits'
);

-- terminal and not_found.
SELECT is(runrelay.signal_run('s-none', 'go'), 'not_found', 'a signal to an unknown run answers not_found');
SELECT tests.start_run('s4');
SELECT runrelay.complete_attempt('s4', 1, tests.token('s4'));
SELECT is(runrelay.signal_run('s4', 'go'), 'terminal', 'a signal to a completed run answers terminal');
SELECT is(
    (
        SELECT count(*) FROM runrelay.signals
        WHERE run_id = 's4'
    ), 0::bigint, 'nothing is stored for a terminal run'
);
SELECT tests.start_waiting('s5', '{"kind": "event", "name": "go"}');
SELECT tests.mark_cancel('s5');
SELECT is(
    runrelay.signal_run('s5', 'go'), 'terminal',
    'a signal to a run with a pending cancellation answers terminal (the cancellation is applied)'
);
SELECT is(tests.state('s5'), 'cancelled:cancelled', 'the signal applied the marker instead of resuming');
SELECT is(
    tests.lifecycle('s5'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.cancelled'],
    'run.cancelled, not run.resumed, is emitted'
);

-- A signal that arrives after the wait's timeout_at, before any claim woke
-- the run: the wait has timed out (SPEC: a wait past its timeout_at resumes
-- with {"timed_out": true}), so the signal is no longer awaited.
SELECT tests.start_waiting(
    's7', jsonb_build_object('kind', 'event', 'name', 'go', 'timeout_at', now() + interval '1 minute')
);
SELECT tests.set_clock('2 minutes');
SELECT is(
    runrelay.signal_run('s7', 'go', '{"late": true}'), 'stored',
    'a signal after timeout_at is stored, not delivered to the timed-out wait'
);
SELECT results_eq(
    $$SELECT attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['s7'])$$,
    $$VALUES (2, '{"timed_out": true}'::jsonb)$$,
    'the next claim resumes the timed-out wait with {"timed_out": true}'
);
SELECT tests.set_clock('0');

-- suspend_attempt: cancelled.
SELECT tests.start_run('s6');
SELECT tests.mark_cancel('s6');
SELECT is(
    runrelay.suspend_attempt('s6', 1, tests.token('s6'), '{"kind": "event", "name": "go"}'), 'cancelled',
    'suspend answers cancelled when a cancel marker exists (and the run does not wait)'
);
SELECT is(tests.state('s6'), 'cancelled:cancelled', 'the suspend applied the marker: run and attempt are cancelled');
SELECT is(
    tests.lifecycle('s6'), ARRAY['run.queued', 'run.started', 'run.cancelled'],
    'run.cancelled, not run.waiting, is emitted'
);

SELECT * FROM finish();
ROLLBACK;
