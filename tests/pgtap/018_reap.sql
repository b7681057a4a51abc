-- reap_expired (SPEC §3.2): expired leases end lost and the run retries or
-- fails as with fail_attempt; cancelled when a marker exists; waiting for a
-- prepared / claimed-for-terminal attempt of a waiting run; stranded markers
-- applied; live leases untouched; max_attempts bounds a call, oldest expiry
-- first. Everything here shares one clock, moved forward step by step.
BEGIN;
SELECT plan(24);

-- t = 0: leases of 30 s unless stated.
SELECT tests.start_run('ra1');
SELECT tests.start_run('ra2');
SELECT runrelay.heartbeat('ra2', 1, tests.token('ra2'), 60);
SELECT tests.start_run('rf', 1);
SELECT tests.start_run('rc');
SELECT tests.mark_cancel('rc', 'reaped');
SELECT tests.start_waiting('rp', '{"kind": "event", "name": "go"}');
SELECT runrelay.prepare_waiting_failure('rp', 1, tests.token('rp'));
SELECT tests.start_waiting('rs', '{"kind": "event", "name": "go"}');
SELECT tests.start_run('rl1');
SELECT runrelay.heartbeat('rl1', 1, tests.token('rl1'), 90);
SELECT tests.start_run('rl2');
SELECT runrelay.heartbeat('rl2', 1, tests.token('rl2'), 100);

SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired()$$,
    $$VALUES ('rc', 1, 'cancelled')$$,
    'at t = 0 no lease has expired: only the marker no writer applied (rc) is applied, as cancelled'
);
SELECT is(tests.state('ra1'), 'running:running', 'a live lease is untouched');
SELECT tests.mark_cancel('rs', 'stranded');

-- t = 45 s.
SELECT tests.set_clock('45 seconds');
SELECT set_eq(
    $$SELECT * FROM runrelay.reap_expired()$$,
    $$VALUES ('ra1', 1, 'retry_scheduled'), ('rf', 1, 'failed'), ('rp', 1, 'waiting'), ('rs', 1, 'cancelled')$$,
    'expired leases are reaped (retry_scheduled, failed, waiting) and a stranded marker is applied (cancelled)'
);
SELECT results_eq(
    $$SELECT r.status, r.error IS NOT NULL, r.run_at > statement_timestamp() + interval '45 seconds', a.status,
             a.finished_at IS NOT NULL
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'ra1'$$,
    $$VALUES ('queued', TRUE, TRUE, 'lost', TRUE)$$,
    'a reaped attempt is lost; its run is queued again after a backoff, with an error'
);
SELECT is(
    tests.lifecycle('ra1'), ARRAY['run.queued', 'run.started', 'run.retry_scheduled'],
    'reaping into a retry emits run.retry_scheduled'
);
SELECT is(tests.state('rf'), 'failed:lost', 'with no attempts left the reaped run is failed, its attempt lost');
SELECT is(
    tests.lifecycle('rf'), ARRAY['run.queued', 'run.started', 'run.failed'], 'reaping into a failure emits run.failed'
);
SELECT results_eq(
    $$SELECT r.status, r.wait, a.status FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'rp'$$,
    $$VALUES ('waiting', '{"kind": "event", "name": "go"}'::jsonb, 'waiting')$$,
    'an expired prepared attempt goes back to waiting and the run keeps its wait'
);
SELECT is(
    tests.lifecycle('rp'), ARRAY['run.queued', 'run.started', 'run.waiting'], 'sending it back to waiting emits nothing'
);
SELECT is(tests.state('rs'), 'cancelled:cancelled', 'the stranded marker cancelled the waiting run');
SELECT is(
    (
        SELECT count(*) FROM runrelay.cancellations
        WHERE run_id IN ('rs', 'rc')
    ), 0::bigint,
    'applied markers are removed'
);
SELECT is(tests.state('ra2'), 'running:running', 'a lease extended by heartbeat (60 s) is not reaped at 45 s');

SELECT is(tests.state('rc'), 'cancelled:cancelled', 'the running run with a stranded marker was cancelled at t = 0');

-- The old worker learns it lost its lease.
SELECT is(
    runrelay.complete_attempt('ra1', 1, tests.token('ra1')), 'fence_lost',
    'a write for a reaped attempt answers fence_lost'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('ra1', 1, tests.token('ra1'))), 'fence_lost',
    'a heartbeat for a reaped attempt answers fence_lost'
);
SELECT is(tests.state('ra1'), 'queued:lost', 'and changes nothing');

-- Reaping again is harmless.
SELECT is_empty($$SELECT * FROM runrelay.reap_expired()$$, 'a second reap finds nothing more to do');
SELECT is(
    tests.event_count('ra1') + tests.event_count('rf') + tests.event_count('rs'), 10::bigint,
    'the second reap emits nothing'
);

-- t = 2 min: ra2 (60 s), rl1 (90 s), rl2 (100 s) have expired; one per call, oldest expiry first.
SELECT tests.set_clock('2 minutes');
SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired(max_attempts => 1)$$,
    $$VALUES ('ra2', 1, 'retry_scheduled')$$,
    'max_attempts => 1 reaps one attempt: the oldest expiry first'
);
SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired(max_attempts => 1)$$,
    $$VALUES ('rl1', 1, 'retry_scheduled')$$,
    'the next call reaps the next oldest'
);
SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired(max_attempts => 1)$$,
    $$VALUES ('rl2', 1, 'retry_scheduled')$$,
    'and the next'
);
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w2', queues => ARRAY['ra1'])$$,
    $$VALUES ('ra1', 2)$$,
    'a reaped run is claimed again as its next attempt'
);

-- A reaped run whose marker exists ends cancelled rather than retried.
SELECT tests.mark_cancel('ra1');
SELECT tests.set_clock('10 minutes');
SELECT results_eq(
    $$SELECT * FROM runrelay.reap_expired() WHERE run_id = 'ra1'$$,
    $$VALUES ('ra1', 2, 'cancelled')$$,
    'an expired attempt whose run has a cancel marker is reaped as cancelled'
);
SELECT is(tests.state('ra1'), 'cancelled:lost,cancelled', 'the run and its expired attempt end cancelled');

SELECT * FROM finish();
ROLLBACK;
