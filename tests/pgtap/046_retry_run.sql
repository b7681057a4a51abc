-- retry_run (docs/admin.md): a failed or cancelled run is queued again as a
-- new attempt series (retried, run.retried emitted with who and why), its
-- budget counted from the new series; every other status is not_retryable
-- and an unknown run not_found, both writing nothing; a keyed run rejoins
-- its key at the back; a call_id makes a repeat answer the first outcome
-- and write nothing; bad input raises 22023.
BEGIN;
SELECT plan(50);

-- Fail a run's current attempt; the outcome.
CREATE FUNCTION pg_temp.fail(p_run_id text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT runrelay.fail_attempt(c.run_id, c.attempt, c.lease_token, '{"e": "again"}', retry_at => now() - interval '1 day')
    FROM tests.claim_run(p_run_id) AS c;
$$;

-- retried: a failed run.
SELECT tests.start_run('f1', p_max_attempts => 1);
SELECT runrelay.fail_attempt('f1', 1, tests.token('f1'), '{"e": "first"}');
SELECT is(tests.state('f1'), 'failed:failed', 'fixture: f1 failed its one attempt');
SELECT is(
    runrelay.retry_run('f1', reason => 'the bug is fixed', requested_by => 'alice'), 'retried',
    'a failed run: retried'
);
SELECT results_eq(
    $$SELECT status, finished_at, attempt_count, series_start, max_attempts, error, run_at <= statement_timestamp()
      FROM runrelay.runs WHERE run_id = 'f1'$$,
    $$VALUES ('queued', NULL::timestamptz, 1, 1, 1, '{"e": "first"}'::jsonb, TRUE)$$,
    'queued and due now, a new series after attempt 1, its budget and last error kept'
);
SELECT is(
    tests.lifecycle('f1'), ARRAY['run.queued', 'run.started', 'run.failed', 'run.retried'],
    'run.retried follows run.failed'
);
SELECT results_eq(
    $$SELECT payload - 'run_at'
      FROM runrelay.ledger WHERE run_id = 'f1' AND type = 'run.retried'$$,
    $$VALUES (jsonb_build_object(
        'attempt', 1, 'previous_status', 'failed', 'max_attempts', 1, 'reason', 'the bug is fixed',
        'requested_by', 'alice', 'session_user', session_user::text
    ))$$,
    'run.retried records the last attempt, the status, the budget, the reason and who asked'
);
SELECT is((tests.claim_run('f1')).attempt, 2, 'the next claim opens attempt 2');
SELECT is(
    runrelay.fail_attempt('f1', 2, tests.token('f1', 2), '{"e": "second"}'), 'failed',
    'the new series has its own budget of one attempt: failed again'
);
SELECT is(runrelay.retry_run('f1', max_attempts => 2), 'retried', 'retried again, with a budget of two');
SELECT is(pg_temp.fail('f1'), 'retry_scheduled', 'the first failure of the third series leaves one attempt');
SELECT is(pg_temp.fail('f1'), 'failed', 'the second uses it up');
SELECT results_eq(
    $$SELECT status, attempt_count, series_start, max_attempts FROM runrelay.runs WHERE run_id = 'f1'$$,
    $$VALUES ('failed', 4, 2, 2)$$,
    'attempts numbered on: 4 attempts, the last series after attempt 2'
);
SELECT results_eq(
    $$SELECT attempt, status FROM runrelay.run_attempts('f1')$$,
    $$VALUES (1, 'failed'), (2, 'failed'), (3, 'failed'), (4, 'failed')$$,
    'every attempt of every series stays'
);

-- retried: cancelled runs, queued or running when cancelled.
SELECT runrelay.enqueue_run('c1', 'c1');
SELECT runrelay.cancel_run('c1', 'not now');
SELECT is(runrelay.retry_run('c1'), 'retried', 'a run cancelled before it started: retried');
SELECT results_eq(
    $$SELECT status, series_start FROM runrelay.runs WHERE run_id = 'c1'$$,
    $$VALUES ('queued', 0)$$,
    'it has no attempt: the new series starts at 0'
);
SELECT tests.start_run('c2');
SELECT runrelay.cancel_run('c2');
SELECT is(tests.state('c2'), 'cancelled:cancelled', 'fixture: c2 cancelled while running');
SELECT is(runrelay.retry_run('c2', run_at => now() + interval '1 hour'), 'retried', 'a run cancelled while running: retried');
SELECT is(
    (SELECT count(*) FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY['c2'])), 0::bigint,
    'run_at in the future: not claimable yet'
);
SELECT tests.set_clock('2 hours');
SELECT is((tests.claim_run('c2')).attempt, 2, 'claimable at run_at, as attempt 2');
SELECT tests.set_clock('0');

-- A stale cancel marker of an ended run cannot cancel the retried run.
SELECT tests.start_run('m1', p_max_attempts => 1);
SELECT runrelay.fail_attempt('m1', 1, tests.token('m1'), '{}');
SELECT tests.mark_cancel('m1');
SELECT is(runrelay.retry_run('m1'), 'retried', 'a failed run with a stale marker: retried');
SELECT is((
    SELECT count(*) FROM runrelay.cancellations
    WHERE run_id = 'm1'
), 0::bigint, 'the marker is gone');
SELECT is((tests.claim_run('m1')).attempt, 2, 'and the run starts');

-- not_retryable and not_found change nothing.
SELECT runrelay.enqueue_run('q1', 'q1');
SELECT tests.start_run('r1');
SELECT tests.start_waiting('w1', '{"kind": "event", "name": "go"}');
SELECT tests.start_run('d1');
SELECT runrelay.complete_attempt('d1', 1, tests.token('d1'), '{"ok": true}');
SELECT tests.remember('before');
SELECT is(runrelay.retry_run('q1'), 'not_retryable', 'a queued run: not_retryable');
SELECT is(runrelay.retry_run('r1'), 'not_retryable', 'a running run: not_retryable');
SELECT is(runrelay.retry_run('w1'), 'not_retryable', 'a waiting run: not_retryable');
SELECT is(runrelay.retry_run('d1'), 'not_retryable', 'a completed run: not_retryable');
SELECT is(runrelay.retry_run('nobody'), 'not_found', 'an unknown run: not_found');
SELECT is(
    runrelay.retry_run('d1', call_id => '00000000-0000-4000-8000-0000000000d1'), 'not_retryable',
    'not_retryable with a call_id'
);
SELECT is(tests.everything(), tests.seen('before'), '... and none of them wrote anything');

-- A keyed run rejoins its key at the back.
SELECT tests.start_run('k1', p_max_attempts => 1, p_concurrency_key => 'key');
SELECT runrelay.fail_attempt('k1', 1, tests.token('k1'), '{}');
SELECT runrelay.enqueue_run('k2', 'k2', concurrency_key => 'key');
SELECT tests.claim_run('k2');
SELECT is(runrelay.retry_run('k1'), 'retried', 'a keyed run while another run of its key is running');
SELECT results_eq(
    $$SELECT key_held, key_position > (SELECT r.key_position FROM runrelay.runs AS r WHERE r.run_id = 'k2')
      FROM runrelay.runs WHERE run_id = 'k1'$$,
    $$VALUES (TRUE, TRUE)$$,
    'held behind it, at the back of the key'
);
SELECT is(
    (SELECT count(*) FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY['k1'])), 0::bigint,
    'not claimable while the key is busy'
);
SELECT runrelay.complete_attempt('k2', 1, tests.token('k2'));
SELECT is((tests.claim_run('k1')).attempt, 2, 'claimable once the key''s running run ended');
SELECT tests.start_run('k3', p_max_attempts => 1, p_concurrency_key => 'lone');
SELECT runrelay.fail_attempt('k3', 1, tests.token('k3'), '{}');
SELECT is(runrelay.retry_run('k3'), 'retried', 'a keyed run alone on its key');
SELECT is((
    SELECT key_held FROM runrelay.runs
    WHERE run_id = 'k3'
), FALSE, 'heads its key at once');

-- call_id: a repeat answers the first outcome and writes nothing.
SELECT tests.start_run('i1', p_max_attempts => 1);
SELECT runrelay.fail_attempt('i1', 1, tests.token('i1'), '{}');
SELECT is(
    runrelay.retry_run('i1', reason => 'once', call_id => '00000000-0000-4000-8000-0000000000a1'), 'retried',
    'retried, with a call_id'
);
SELECT is(pg_temp.fail('i1'), 'failed', 'fixture: the retried run failed again');
SELECT tests.remember('replay');
SELECT is(
    runrelay.retry_run('i1', reason => 'once', call_id => '00000000-0000-4000-8000-0000000000a1'), 'retried',
    'the repeat answers retried'
);
SELECT is(tests.everything(), tests.seen('replay'), '... and writes nothing: the run stays failed');
SELECT throws_ok(
    $$SELECT runrelay.retry_run('i1', reason => 'twice', call_id => '00000000-0000-4000-8000-0000000000a1')$$,
    '22023', NULL, 'the same call_id with another reason'
);
SELECT throws_ok(
    $$SELECT runrelay.retry_run('f1', reason => 'once', call_id => '00000000-0000-4000-8000-0000000000a1')$$,
    '22023', NULL, 'the same call_id for another run'
);
SELECT throws_ok(
    $$SELECT runrelay.cancel_run('i1', call_id => '00000000-0000-4000-8000-0000000000a1')$$,
    '22023', NULL, 'the same call_id for cancel_run'
);
SELECT is(runrelay.retry_run('i1', reason => 'once'), 'retried', 'without the call_id: a new retry');

-- Bad input.
SELECT throws_ok($$SELECT runrelay.retry_run(NULL)$$, '22023', NULL, 'null run_id');
SELECT throws_ok($$SELECT runrelay.retry_run(' ')$$, '22023', NULL, 'blank run_id');
SELECT throws_ok($$SELECT runrelay.retry_run('f1', max_attempts => 0)$$, '22023', NULL, 'max_attempts 0');
SELECT throws_ok($$SELECT runrelay.retry_run('f1', max_attempts => 1001)$$, '22023', NULL, 'max_attempts 1001');
SELECT throws_ok($$SELECT runrelay.retry_run('f1', run_at => 'infinity')$$, '22023', NULL, 'infinite run_at');
SELECT throws_ok($$SELECT runrelay.retry_run('f1', reason => repeat('r', 2001))$$, '22023', NULL, 'a reason over 2000 characters');
SELECT throws_ok($$SELECT runrelay.retry_run('f1', requested_by => '')$$, '22023', NULL, 'an empty requested_by');
SELECT throws_ok(
    $$SELECT runrelay.retry_run('f1', call_id => '00000000-0000-0000-0000-000000000000')$$, '22023', NULL, 'the nil uuid as call_id'
);

SELECT * FROM finish();
ROLLBACK;
