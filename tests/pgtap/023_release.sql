-- release_attempt: released (the run is queued again at run_at, the attempt
-- does not count against max_attempts), cancelled, fence_lost (wrong token,
-- stale attempt, a reaped lease, a waiting run), exact replays, the
-- run.retry_scheduled payload, the concurrency key kept, bad input raising
-- and changing nothing. Reaping comes last: it moves the shared clock.
BEGIN;
SELECT plan(60);

UPDATE runrelay.settings SET retry_base_seconds = 10, retry_max_seconds = 25;

-- released, at an explicit run_at.
SELECT tests.start_run('rl1', 3);
SELECT is(
    runrelay.release_attempt('rl1', 1, tests.token('rl1'), now() + interval '1 minute', 'shutdown'),
    'released', 'release_attempt of a live attempt answers released'
);
SELECT results_eq(
    $$SELECT r.status, r.run_at, r.error, r.finished_at, r.attempt_count, a.status, a.error,
             a.finished_at IS NOT NULL, a.outcome, a.outcome_op
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'rl1'$$,
    $$VALUES ('queued', now() + interval '1 minute', NULL::jsonb, NULL::timestamptz, 1, 'released', NULL::jsonb,
              TRUE, 'released', 'release')$$,
    'the run is queued at run_at without an error; the attempt is released, finished, its outcome recorded'
);
SELECT is(
    tests.lifecycle('rl1'), ARRAY['run.queued', 'run.started', 'run.retry_scheduled'],
    'a release emits run.retry_scheduled'
);
SELECT is(
    (
        SELECT l.payload FROM runrelay.ledger AS l
        WHERE l.run_id = 'rl1' AND l.type = 'run.retry_scheduled'
    ),
    jsonb_build_object('attempt', 1, 'run_at', now() + interval '1 minute', 'released', TRUE, 'reason', 'shutdown'),
    'the event carries attempt, run_at, released = true and the reason'
);

-- Exact replays.
SELECT is(
    runrelay.release_attempt('rl1', 1, tests.token('rl1'), now() + interval '1 minute', 'shutdown'),
    'released', 'a replayed release answers released again'
);
SELECT is(
    runrelay.release_attempt('rl1', 1, tests.token('rl1'), NULL, 'something else'),
    'released', 'a replay with other arguments answers the recorded outcome, like every fenced write'
);
SELECT is(tests.event_count('rl1'), 3::bigint, 'the replays emit no second event');
-- The replays leave run_at alone, and run_at is honoured.
SELECT * FROM tests.queued_for_a_minute(
    'rl1',
    p_run_at => 'the replays do not reschedule the run',
    p_not_before => 'a released run is not claimable before run_at',
    p_after => 'after run_at the run is claimed again, as attempt 2'
);
SELECT is(
    runrelay.release_attempt('rl1', 1, tests.token('rl1', 1)), 'released',
    'a replay of attempt 1''s release after attempt 2 started still answers released'
);
SELECT is(tests.state('rl1'), 'running:released,running', 'that replay does not touch attempt 2');

-- fence_lost.
SELECT is(
    runrelay.release_attempt('rl1', 2, gen_random_uuid()), 'fence_lost', 'a wrong token answers fence_lost'
);
SELECT is(
    runrelay.release_attempt('rl1', 3, tests.token('rl1', 2)), 'fence_lost',
    'an attempt that does not exist answers fence_lost'
);
SELECT is(
    runrelay.release_attempt('rl-none', 1, tests.token('rl1', 2)), 'fence_lost',
    'a run that does not exist answers fence_lost'
);
SELECT is(
    runrelay.complete_attempt('rl1', 1, tests.token('rl1', 1)), 'fence_lost',
    'a released attempt cannot be completed afterwards'
);
SELECT is(
    runrelay.fail_attempt('rl1', 1, tests.token('rl1', 1), '{}'), 'fence_lost',
    'a released attempt cannot be failed afterwards'
);
SELECT is(
    (runrelay.heartbeat('rl1', 1, tests.token('rl1', 1))).outcome, 'fence_lost',
    'a released attempt cannot heartbeat afterwards'
);
SELECT is(tests.state('rl1'), 'running:released,running', 'fenced-out writes change nothing');
SELECT tests.start_run('rl-done');
SELECT runrelay.complete_attempt('rl-done', 1, tests.token('rl-done'));
SELECT is(
    runrelay.release_attempt('rl-done', 1, tests.token('rl-done')), 'fence_lost',
    'a completed attempt cannot be released'
);
SELECT is(tests.state('rl-done'), 'completed:completed', 'the completed run is untouched');
SELECT tests.start_waiting('rl-wait', '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.release_attempt('rl-wait', 1, tests.token('rl-wait')), 'fence_lost',
    'a suspended attempt cannot be released'
);
SELECT runrelay.prepare_waiting_failure('rl-wait', 1, tests.token('rl-wait'));
SELECT is(
    runrelay.release_attempt('rl-wait', 1, tests.token('rl-wait')), 'fence_lost',
    'an attempt prepared for a waiting failure cannot release the run (its wait would be lost)'
);
SELECT results_eq(
    $$SELECT r.status, r.wait, a.status FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'rl-wait'$$,
    $$VALUES ('waiting', '{"kind": "event", "name": "go"}'::jsonb, 'running')$$,
    'the waiting run keeps its wait and the prepared attempt stays prepared'
);

-- released now (run_at null), without a reason; the run keeps its resume.
SELECT tests.start_run('rl-now');
UPDATE runrelay.runs SET resume = '{"name": "go", "payload": {}}'
WHERE run_id = 'rl-now';
SELECT is(runrelay.release_attempt('rl-now', 1, tests.token('rl-now')), 'released', 'a release without run_at');
SELECT ok(
    (
        SELECT
            l.payload = jsonb_build_object('attempt', 1, 'run_at', r.run_at, 'released', TRUE, 'reason', NULL)
            AND r.run_at <= statement_timestamp()
        FROM runrelay.runs AS r
        INNER JOIN runrelay.ledger AS l ON r.run_id = l.run_id AND l.type = 'run.retry_scheduled'
        WHERE r.run_id = 'rl-now'
    ),
    'without run_at the run is runnable now, and the event says so with a null reason'
);
SELECT results_eq(
    $$SELECT run_id, attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['rl-now'])$$,
    $$VALUES ('rl-now', 2, '{"name": "go", "payload": {}}'::jsonb)$$,
    'it is claimable at once, and the next attempt gets the resume the released one had'
);

-- The budget: released attempts do not count against max_attempts.
SELECT tests.start_run('rl-once', 1);
SELECT is(runrelay.release_attempt('rl-once', 1, tests.token('rl-once', 1)), 'released', 'max_attempts = 1: release 1');
SELECT tests.claim_run('rl-once');
SELECT is(runrelay.release_attempt('rl-once', 2, tests.token('rl-once', 2)), 'released', 'max_attempts = 1: release 2');
SELECT tests.claim_run('rl-once');
SELECT is(runrelay.release_attempt('rl-once', 3, tests.token('rl-once', 3)), 'released', 'max_attempts = 1: release 3');
SELECT is(tests.state('rl-once'), 'queued:released,released,released', 'after three releases the run is still queued');
SELECT tests.claim_run('rl-once');
SELECT is(
    runrelay.fail_attempt('rl-once', 4, tests.token('rl-once', 4), '{"code": "boom"}', retry_at => now()), 'failed',
    'the first failure, in attempt 4, is the one that exhausts max_attempts = 1'
);
SELECT is(tests.state('rl-once'), 'failed:released,released,released,failed', 'only then is the run failed');

SELECT tests.start_run('rl-two', 2);
SELECT is(
    runrelay.fail_attempt('rl-two', 1, tests.token('rl-two', 1), '{}', retry_at => now()), 'retry_scheduled',
    'max_attempts = 2: the first failure retries'
);
SELECT tests.claim_run('rl-two');
SELECT runrelay.release_attempt('rl-two', 2, tests.token('rl-two', 2));
SELECT tests.claim_run('rl-two');
SELECT is(
    runrelay.fail_attempt('rl-two', 3, tests.token('rl-two', 3), '{}', retry_at => now()), 'failed',
    'a release between two failures does not buy a third: the second failure fails the run'
);

SELECT tests.start_run('rl-bo', 3);
SELECT runrelay.release_attempt('rl-bo', 1, tests.token('rl-bo', 1));
SELECT tests.claim_run('rl-bo');
SELECT runrelay.release_attempt('rl-bo', 2, tests.token('rl-bo', 2));
SELECT tests.claim_run('rl-bo');
SELECT is(runrelay.fail_attempt('rl-bo', 3, tests.token('rl-bo', 3), '{}'), 'retry_scheduled', 'attempt 3 fails');
SELECT ok(
    (
        SELECT run_at - updated_at FROM runrelay.runs
        WHERE run_id = 'rl-bo'
    )
    BETWEEN interval '5 seconds' AND interval '10 seconds',
    'the backoff is that of a first failure (within [base/2, base]), not of a third attempt'
);

-- Nothing caps attempt numbers: more releases than max_attempts can ever be.
SELECT tests.start_run('rl-many', 1);
DO $$
BEGIN
    FOR v_attempt IN 1..1001 LOOP
        IF runrelay.release_attempt('rl-many', v_attempt, tests.token('rl-many', v_attempt)) <> 'released' THEN
            RAISE EXCEPTION 'release % of rl-many was not released', v_attempt;
        END IF;
        PERFORM tests.claim_run('rl-many');
    END LOOP;
END
$$;
SELECT results_eq(
    $$SELECT r.status, r.attempt_count, a.status FROM runrelay.runs AS r
      INNER JOIN runrelay.attempts AS a ON a.run_id = r.run_id AND a.attempt = r.attempt_count
      WHERE r.run_id = 'rl-many'$$,
    $$VALUES ('running', 1002, 'running')$$,
    'a run released 1001 times (max_attempts = 1) is still claimed: attempt 1002 runs'
);

-- A released run keeps its place at the head of its concurrency key.
SELECT tests.start_run('rl-k1', 3, 'rl-key');
SELECT runrelay.enqueue_run(run_id => 'rl-k2', queue => 'rl-k1', concurrency_key => 'rl-key');
SELECT is(runrelay.release_attempt('rl-k1', 1, tests.token('rl-k1')), 'released', 'a keyed run is released');
SELECT results_eq(
    $$SELECT run_id, key_held FROM runrelay.runs WHERE run_id IN ('rl-k1', 'rl-k2') ORDER BY run_id$$,
    $$VALUES ('rl-k1', FALSE), ('rl-k2', TRUE)$$,
    'the released run stays the head of its key; the next run of the key stays held'
);
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['rl-k1'], max_runs => 2)$$,
    $$VALUES ('rl-k1', 2)$$,
    'the next claim on the key takes the released run again, and only it'
);

-- cancelled: a cancel marker wins.
SELECT tests.start_run('rl-c', 3);
SELECT tests.mark_cancel('rl-c', 'stop it');
SELECT is(
    runrelay.release_attempt('rl-c', 1, tests.token('rl-c'), NULL, 'shutdown'), 'cancelled',
    'release_attempt answers cancelled when a cancel marker exists'
);
SELECT is(tests.state('rl-c'), 'cancelled:cancelled', 'the marker won: the run is cancelled, not queued again');
SELECT is(
    tests.lifecycle('rl-c'), ARRAY['run.queued', 'run.started', 'run.cancelled'],
    'no run.retry_scheduled is emitted when the marker wins'
);
SELECT is(runrelay.release_attempt('rl-c', 1, tests.token('rl-c')), 'cancelled', 'the replay answers cancelled');
SELECT is(tests.event_count('rl-c'), 3::bigint, 'the replay emits nothing');

-- Bad input raises 22023 and changes nothing.
SELECT tests.start_run('rl-bad');
SELECT throws_ok(
    $$SELECT runrelay.release_attempt(NULL, 1, tests.token('rl-bad'))$$, '22023', NULL, 'a null run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt(' ', 1, tests.token('rl-bad'))$$, '22023', NULL, 'a blank run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt(repeat('x', 201), 1, tests.token('rl-bad'))$$, '22023', NULL,
    'a run_id over 200 characters'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('rl-bad', NULL, tests.token('rl-bad'))$$, '22023', NULL, 'a null attempt'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('rl-bad', 0, tests.token('rl-bad'))$$, '22023', NULL, 'attempt 0'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('rl-bad', 1, NULL)$$, '22023', NULL, 'a null lease_token'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('rl-bad', 1, tests.token('rl-bad'), 'infinity')$$, '22023', NULL,
    'an infinite run_at'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('rl-bad', 1, tests.token('rl-bad'), NULL, repeat('r', 2001))$$, '22023',
    'runrelay: invalid reason: is 2001 characters; at most 2000', 'a reason over 2000 characters, named in the error'
);
SELECT ok(
    tests.state('rl-bad') = 'running:running' AND tests.event_count('rl-bad') = 2,
    'the calls that raised changed nothing: the attempt still runs, no event was emitted'
);
SELECT is(
    runrelay.release_attempt('rl-bad', 1, tests.token('rl-bad'), NULL, repeat('r', 2000)), 'released',
    'a reason of exactly 2000 characters is accepted'
);

-- An expired lease that was not reaped still passes the fence (SPEC §1); a
-- reaped one does not. A reaped attempt after releases: the budget counts
-- the lost attempt only.
SELECT tests.start_run('rl-exp', 3);
SELECT tests.start_run('rl-reap', 2);
SELECT runrelay.release_attempt('rl-reap', 1, tests.token('rl-reap', 1));
SELECT tests.claim_run('rl-reap');
SELECT runrelay.release_attempt('rl-reap', 2, tests.token('rl-reap', 2));
SELECT tests.claim_run('rl-reap');
SELECT tests.start_run('rl-lost', 3);
SELECT tests.set_clock('45 seconds');
SELECT is(
    runrelay.release_attempt('rl-exp', 1, tests.token('rl-exp')), 'released',
    'an expired lease not yet reaped can still be released'
);
SELECT set_eq(
    $$SELECT * FROM runrelay.reap_expired() WHERE run_id IN ('rl-reap', 'rl-lost')$$,
    $$VALUES ('rl-reap', 3, 'retry_scheduled'), ('rl-lost', 1, 'retry_scheduled')$$,
    'attempt 3 of a max_attempts = 2 run is reaped into a retry: two releases and one loss are one failure'
);
SELECT is(
    runrelay.release_attempt('rl-lost', 1, tests.token('rl-lost')), 'fence_lost',
    'after its lease expired and was reaped, an attempt cannot be released'
);
SELECT is(tests.state('rl-lost'), 'queued:lost', 'the reaped attempt stays lost');

SELECT * FROM finish();
ROLLBACK;
