-- fail_attempt (SPEC §3.2): retry_scheduled (retry_at or exponential backoff
-- with jitter), failed when attempts are exhausted, cancelled, fence_lost,
-- replays, and final_events before the retry/failure event. superseded and
-- protect_waiting_suspension are covered in 016 and 017.
BEGIN;
SELECT plan(32);

UPDATE runrelay.settings SET retry_base_seconds = 10, retry_max_seconds = 25;

-- retry_scheduled at an explicit retry_at.
SELECT tests.start_run('f1', 3);
SELECT is(
    runrelay.fail_attempt(
        'f1', 1, tests.token('f1'), '{"code": "boom"}', retry_at => now() + interval '1 minute',
        final_events => '[{"type": "app.cleanup"}]'
    ),
    'retry_scheduled', 'fail_attempt with attempts left answers retry_scheduled'
);
SELECT results_eq(
    $$SELECT r.status, r.run_at, r.error, r.finished_at, a.status, a.error, a.finished_at IS NOT NULL
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'f1'$$,
    $$VALUES ('queued', now() + interval '1 minute', '{"code": "boom"}'::jsonb, NULL::timestamptz,
              'failed', '{"code": "boom"}'::jsonb, TRUE)$$,
    'the run is queued again at retry_at with the error; the attempt is failed with the error'
);
SELECT is(
    tests.lifecycle('f1'), ARRAY['run.queued', 'run.started', 'app.cleanup', 'run.retry_scheduled'],
    'final_events come before run.retry_scheduled'
);
SELECT is(
    runrelay.fail_attempt('f1', 1, tests.token('f1'), '{"code": "boom"}', retry_at => now() + interval '1 minute'),
    'retry_scheduled', 'a replayed fail_attempt answers retry_scheduled again'
);
SELECT is(tests.event_count('f1'), 4::bigint, 'the replay emits nothing');
SELECT * FROM tests.queued_for_a_minute(
    'f1',
    p_run_at => 'the replay does not reschedule the run',
    p_not_before => 'the retry is not claimable before retry_at',
    p_after => 'after retry_at the run is claimed again as attempt 2'
);
SELECT is(
    runrelay.fail_attempt('f1', 1, tests.token('f1', 1), '{"code": "boom"}'), 'retry_scheduled',
    'a replay of attempt 1''s failure after attempt 2 started still answers what it recorded'
);
SELECT is(tests.state('f1'), 'running:failed,running', 'that replay does not touch attempt 2');

-- fence_lost.
SELECT is(
    runrelay.fail_attempt('f1', 2, gen_random_uuid(), '{}'), 'fence_lost', 'a wrong token answers fence_lost'
);
SELECT is(
    runrelay.fail_attempt('f1', 3, tests.token('f1', 2), '{}'), 'fence_lost',
    'an attempt that does not exist answers fence_lost'
);
SELECT is(
    runrelay.fail_attempt('f-none', 1, tests.token('f1', 2), '{}'), 'fence_lost',
    'a run that does not exist answers fence_lost'
);
SELECT is(
    runrelay.complete_attempt('f1', 1, tests.token('f1', 1)), 'fence_lost',
    'a failed attempt cannot be completed afterwards (fence_lost)'
);
SELECT is(tests.state('f1'), 'running:failed,running', 'fenced-out writes change nothing');

-- failed once attempts are exhausted.
SELECT is(
    runrelay.fail_attempt('f1', 2, tests.token('f1', 2), '{"code": "again"}', retry_at => now()), 'retry_scheduled',
    'the second of three attempts retries'
);
SELECT tests.claim_run('f1');
SELECT is(
    runrelay.fail_attempt('f1', 3, tests.token('f1', 3), '{"code": "last"}', final_events => '[{"type": "app.bye"}]'),
    'failed', 'the failure of the last allowed attempt answers failed'
);
SELECT results_eq(
    $$SELECT status, error, finished_at IS NOT NULL, attempt_count FROM runrelay.runs WHERE run_id = 'f1'$$,
    $$VALUES ('failed', '{"code": "last"}'::jsonb, TRUE, 3)$$,
    'the run is failed with the last error and finished_at'
);
SELECT is(
    tests.lifecycle('f1'),
    ARRAY[
        'run.queued', 'run.started', 'app.cleanup', 'run.retry_scheduled', 'run.started', 'run.retry_scheduled',
        'run.started', 'app.bye', 'run.failed'
    ],
    'the lifecycle of a run that failed three times, final events before run.failed'
);
SELECT is(
    runrelay.fail_attempt('f1', 3, tests.token('f1', 3), '{"code": "last"}'), 'failed',
    'a replayed final failure answers failed'
);
SELECT is(tests.event_count('f1'), 9::bigint, 'the replay emits no second run.failed');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['f1'])$$, 'a failed run is never claimed'
);

SELECT tests.start_run('f-once', 1);
SELECT is(
    runrelay.fail_attempt('f-once', 1, tests.token('f-once'), '{}', retry_at => now()), 'failed',
    'with max_attempts = 1 the first failure answers failed, even with a retry_at'
);
SELECT is(tests.state('f-once'), 'failed:failed', 'the run and its attempt are failed');

-- Exponential backoff with jitter when retry_at is null:
-- base * 2^(n-1), capped by retry_max_seconds, times a factor in [0.5, 1).
-- Attempt n of bo fails n - 1 minutes on (claimed first, but for the first
-- attempt); the answer is the backoff its failure chose.
CREATE FUNCTION pg_temp.backoff_after_failure(p_attempt integer)
RETURNS interval
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_attempt > 1 THEN
        PERFORM tests.set_clock(make_interval(mins => p_attempt - 1));
        PERFORM tests.claim_run('bo');
    END IF;
    PERFORM runrelay.fail_attempt('bo', p_attempt, tests.token('bo', p_attempt), '{}');
    RETURN (SELECT r.run_at - r.updated_at FROM runrelay.runs AS r WHERE r.run_id = 'bo');
END;
$$;

SELECT tests.start_run('bo', 5);
-- Each failure is called in FROM: BETWEEN would evaluate it twice.
SELECT ok(b.backoff BETWEEN interval '5 seconds' AND interval '10 seconds', 'first failure: backoff within [base/2, base] (base 10 s)')
FROM pg_temp.backoff_after_failure(1) AS b (backoff);
SELECT ok(b.backoff BETWEEN interval '10 seconds' AND interval '20 seconds', 'second failure: backoff doubles, within [base, 2 base]')
FROM pg_temp.backoff_after_failure(2) AS b (backoff);
SELECT
    ok(
        b.backoff BETWEEN interval '12.5 seconds' AND interval '25 seconds',
        'third failure: 4 base exceeds retry_max_seconds, so the delay is capped (25 s) before jitter'
    )
FROM pg_temp.backoff_after_failure(3) AS b (backoff);
SELECT tests.set_clock('0');

-- cancelled.
SELECT tests.start_run('fc', 3);
SELECT tests.mark_cancel('fc', 'stop it');
SELECT is(
    runrelay.fail_attempt('fc', 1, tests.token('fc'), '{"e": 1}', final_events => '[{"type": "app.x"}]'), 'cancelled',
    'fail_attempt answers cancelled when a cancel marker exists'
);
SELECT is(tests.state('fc'), 'cancelled:cancelled', 'the marker won: the run is cancelled, not retried');
SELECT is(
    tests.lifecycle('fc'), ARRAY['run.queued', 'run.started', 'run.cancelled'],
    'neither final events nor run.retry_scheduled are emitted when the marker wins'
);
SELECT is(runrelay.fail_attempt('fc', 1, tests.token('fc'), '{"e": 1}'), 'cancelled', 'the replay answers cancelled');
SELECT is(tests.event_count('fc'), 3::bigint, 'the replay emits nothing');

SELECT * FROM finish();
ROLLBACK;
