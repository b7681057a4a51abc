-- cancel_run (SPEC §3.1): cancelled (queued, running, waiting runs),
-- cancel_requested (a writer holds the custody locks: here a second session
-- holds the run's concurrency key), already_terminal, not_found; the marker is
-- never lost: the next heartbeat, claim or the reaper applies it.
BEGIN;
SELECT plan(39);

SELECT is(runrelay.cancel_run('x-none'), 'not_found', 'cancelling an unknown run answers not_found');
SELECT is(
    (
        SELECT count(*) FROM runrelay.cancellations
        WHERE run_id = 'x-none'
    ), 0::bigint,
    'no marker is left for an unknown run'
);

-- A queued run.
SELECT runrelay.enqueue_run(run_id => 'x1', queue => 'q-x1');
SELECT is(runrelay.cancel_run('x1', 'not needed'), 'cancelled', 'cancelling a queued run answers cancelled');
SELECT results_eq(
    $$SELECT status, finished_at IS NOT NULL, attempt_count FROM runrelay.runs WHERE run_id = 'x1'$$,
    $$VALUES ('cancelled', TRUE, 0)$$,
    'the queued run is cancelled at once, with finished_at'
);
SELECT is(tests.lifecycle('x1'), ARRAY['run.queued', 'run.cancelled'], 'run.cancelled is emitted');
SELECT is(
    (
        SELECT payload ->> 'reason' FROM runrelay.ledger
        WHERE run_id = 'x1' AND type = 'run.cancelled'
    ), 'not needed',
    'run.cancelled carries the reason'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.cancellations
        WHERE run_id = 'x1'
    ), 0::bigint,
    'an applied marker is not kept'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-x1'])$$,
    'a cancelled run is never claimed'
);
SELECT is(runrelay.cancel_run('x1', 'again'), 'already_terminal', 'cancelling it again answers already_terminal');
SELECT is(tests.event_count('x1'), 2::bigint, 'a repeated cancel emits no second run.cancelled');

-- A running run.
SELECT tests.start_run('x2');
SELECT is(runrelay.cancel_run('x2'), 'cancelled', 'cancelling a running run with free locks answers cancelled');
SELECT is(tests.state('x2'), 'cancelled:cancelled', 'the run and its live attempt are cancelled');
SELECT is(
    tests.lifecycle('x2'), ARRAY['run.queued', 'run.started', 'run.cancelled'], 'run.cancelled follows run.started'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('x2', 1, tests.token('x2'))), 'cancelled',
    'the worker learns it at its next heartbeat: cancelled'
);
SELECT is(
    runrelay.complete_attempt('x2', 1, tests.token('x2')), 'cancelled', 'a later complete answers cancelled'
);
SELECT is(runrelay.fail_attempt('x2', 1, tests.token('x2'), '{}'), 'cancelled', 'a later fail answers cancelled');
SELECT is(
    runrelay.suspend_attempt('x2', 1, tests.token('x2'), '{"kind": "event", "name": "e"}'), 'cancelled',
    'a later suspend answers cancelled'
);
SELECT is(tests.event_count('x2'), 3::bigint, 'writes after the cancellation emit nothing');
SELECT is(runrelay.cancel_run('x2'), 'already_terminal', 'a repeated cancel answers already_terminal');

-- A waiting run.
SELECT tests.start_waiting('x3', jsonb_build_object('kind', 'sleep', 'until', now() + interval '1 hour'));
SELECT is(runrelay.cancel_run('x3'), 'cancelled', 'cancelling a waiting run answers cancelled');
SELECT results_eq(
    $$SELECT r.status, r.wait, a.status FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'x3'$$,
    $$VALUES ('cancelled', NULL::jsonb, 'cancelled')$$,
    'the wait is cleared and the waiting attempt is cancelled'
);
SELECT tests.set_clock('2 hours');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['x3'])$$,
    'a cancelled sleep is never woken'
);
SELECT tests.set_clock('0');
SELECT is(
    tests.lifecycle('x3'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.cancelled'],
    'a cancelled wait emits run.cancelled and no run.resumed'
);

-- Runs that already ended.
SELECT tests.start_run('x4');
SELECT runrelay.complete_attempt('x4', 1, tests.token('x4'));
SELECT is(runrelay.cancel_run('x4'), 'already_terminal', 'cancelling a completed run answers already_terminal');
SELECT results_eq(
    $$SELECT status, (SELECT count(*) FROM runrelay.cancellations AS c WHERE c.run_id = 'x4')
      FROM runrelay.runs WHERE run_id = 'x4'$$,
    $$VALUES ('completed', 0::bigint)$$,
    'the completed run stays completed and no marker is kept'
);
SELECT tests.start_run('x5', 1);
SELECT runrelay.fail_attempt('x5', 1, tests.token('x5'), '{}');
SELECT is(runrelay.cancel_run('x5'), 'already_terminal', 'cancelling a failed run answers already_terminal');

-- cancel_requested: a second session holds the run's concurrency key, as a
-- writer in custody of the run would. The marker is written anyway.
SELECT tests.start_run('xr1');
SELECT tests.set_key('xr1', 'xkey1');
SELECT tests.hold_key('xkey1');
SELECT is(
    runrelay.cancel_run('xr1', 'first reason'), 'cancel_requested',
    'with the custody locks busy, cancel_run answers cancel_requested without waiting'
);
SELECT is(runrelay.cancel_run('xr1', 'second reason'), 'cancel_requested', 'a repeat also answers cancel_requested');
SELECT results_eq(
    $$SELECT r.status, c.reason FROM runrelay.runs AS r INNER JOIN runrelay.cancellations AS c USING (run_id)
      WHERE r.run_id = 'xr1'$$,
    $$VALUES ('running', 'first reason')$$,
    'the run is untouched, the marker is written, and the first reason wins'
);
SELECT tests.release_key();
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('xr1', 1, tests.token('xr1'))), 'cancelled',
    'the next writer to take the locks (a heartbeat) applies the marker: cancelled'
);
SELECT is(tests.state('xr1'), 'cancelled:cancelled', 'the run and attempt end cancelled');
SELECT is(
    (
        SELECT payload ->> 'reason' FROM runrelay.ledger
        WHERE run_id = 'xr1' AND type = 'run.cancelled'
    ), 'first reason',
    'run.cancelled carries the marker''s reason'
);

-- cancel_requested on a queued run: the next claim applies it.
SELECT runrelay.enqueue_run(run_id => 'xr2', queue => 'q-xr2');
SELECT tests.set_key('xr2', 'xkey2');
SELECT tests.hold_key('xkey2');
SELECT is(runrelay.cancel_run('xr2'), 'cancel_requested', 'a queued run with its key busy: cancel_requested');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-xr2'])$$,
    'a claim never starts a run that has a cancel marker, even when it cannot apply it yet'
);
SELECT tests.release_key();
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-xr2'])$$,
    'the next claim with the key free does not start the run either'
);
SELECT is(tests.state('xr2'), 'cancelled:', 'that claim applied the marker');

-- cancel_requested on a waiting run: the reaper sweeps the stranded marker.
SELECT tests.start_waiting('xr3', '{"kind": "event", "name": "never"}');
SELECT tests.set_key('xr3', 'xkey3');
SELECT tests.hold_key('xkey3');
SELECT is(runrelay.cancel_run('xr3'), 'cancel_requested', 'a waiting run with its key busy: cancel_requested');
SELECT tests.release_key();
SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired() WHERE run_id = 'xr3'$$,
    $$VALUES ('xr3', 1, 'cancelled')$$,
    'reap_expired applies a marker no writer applied, reported as cancelled'
);
SELECT is(tests.state('xr3'), 'cancelled:cancelled', 'the stranded cancellation is applied: run and attempt cancelled');

SELECT * FROM finish();
ROLLBACK;
