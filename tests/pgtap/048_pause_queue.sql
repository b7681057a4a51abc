-- pause_queue, resume_queue, list_paused_queues (docs/admin.md): claims take
-- no run of a paused queue — named, among others, or with every queue —
-- and take them again once it is resumed; everything else about the
-- queue's runs goes on; outcomes paused, already_paused, resumed,
-- not_paused; 22023 for bad input.
BEGIN;
SELECT plan(30);

-- Claims are installation-wide: start from no runs.
SELECT tests.clear_runs();

-- The run_ids a claim takes, in claim order.
CREATE FUNCTION pg_temp.claimed(p_queues text[], p_max integer DEFAULT 10)
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT coalesce(array_agg(c.run_id), '{}')
    FROM runrelay.claim_attempts(worker => 'w', queues => p_queues, max_runs => p_max) AS c;
$$;

SELECT runrelay.enqueue_run('a1', 'qa', run_at => now() - interval '3 minutes', priority => 5);
SELECT runrelay.enqueue_run('a2', 'qa', run_at => now() - interval '2 minutes', priority => 5);
SELECT runrelay.enqueue_run('b1', 'qb', run_at => now() - interval '1 minute');
SELECT runrelay.enqueue_run('c1', 'qc', run_at => now() - interval '1 minute');

SELECT is(runrelay.pause_queue('qa', 'database maintenance', 'alice'), 'paused', 'pause_queue: paused');
SELECT is(runrelay.pause_queue('qa', 'again', 'bob'), 'already_paused', 'pausing it again: already_paused');
SELECT results_eq(
    $$SELECT queue, reason, paused_by, paused_at IS NOT NULL FROM runrelay.list_paused_queues()$$,
    $$VALUES ('qa', 'database maintenance', 'alice', TRUE)$$,
    'list_paused_queues: the first pause''s reason and operator are kept'
);
SELECT is(pg_temp.claimed(ARRAY['qa']), '{}'::text[], 'a claim naming only the paused queue takes nothing');
SELECT is(pg_temp.claimed(ARRAY['qa', 'qb'], 1), ARRAY['b1'], 'a claim naming it and another takes from the other');
SELECT is(pg_temp.claimed(NULL), ARRAY['c1'], 'a claim of every queue skips the paused one, whatever its priority');
SELECT is(
    (
        SELECT array_agg(r.status ORDER BY r.run_id) FROM runrelay.runs AS r
        WHERE r.queue = 'qa'
    ),
    ARRAY['queued', 'queued'],
    'the paused queue''s runs stay queued'
);

-- Everything else about a paused queue goes on.
SELECT is(
    (SELECT e.created FROM runrelay.enqueue_run('a3', 'qa', run_at => now() - interval '1 minute') AS e), TRUE,
    'enqueueing into a paused queue'
);
SELECT is(runrelay.cancel_run('a3', 'not needed'), 'cancelled', 'cancelling a run of a paused queue');
SELECT is(
    (
        SELECT s.kind FROM runrelay.settle_and_claim(items => '[]', worker => 'w', queues => ARRAY['qa']) AS s
    ),
    NULL,
    'settle_and_claim claims nothing from the paused queue'
);
SELECT is(
    pg_temp.claimed(ARRAY['qa', 'nowhere']), '{}'::text[],
    'a claim naming the paused queue and an empty one takes nothing'
);
-- A run already running in a queue that gets paused goes on.
SELECT runrelay.enqueue_run('d1', 'qd');
SELECT tests.claim_run('d1');
SELECT runrelay.pause_queue('qd');
SELECT is(runrelay.heartbeat('d1', 1, tests.token('d1'))::text LIKE '(ok,%', TRUE, 'a running attempt of a paused queue heartbeats');
SELECT is(runrelay.complete_attempt('d1', 1, tests.token('d1')), 'completed', 'and completes');
SELECT is(runrelay.resume_queue('qd'), 'resumed', 'resume_queue: resumed');
-- A wait that falls due in a paused queue is woken (queued), not started.
SELECT tests.start_waiting('w1', '{"kind": "sleep", "until": "2000-01-01T00:00:00Z"}');
SELECT runrelay.pause_queue('w1');
SELECT is(pg_temp.claimed(NULL), '{}'::text[], 'nothing else is runnable outside the paused queues');
SELECT is(tests.state('w1'), 'queued:resumed', 'the due sleep was woken but its run not started');
SELECT is(runrelay.resume_queue('w1'), 'resumed', 'resumed');
SELECT is(pg_temp.claimed(ARRAY['w1']), ARRAY['w1'], 'and the woken run starts');

-- Resume.
SELECT is(runrelay.resume_queue('qa'), 'resumed', 'resume_queue of the paused queue: resumed');
SELECT is(runrelay.resume_queue('qa'), 'not_paused', 'resuming it again: not_paused');
SELECT is(runrelay.resume_queue('never'), 'not_paused', 'resuming a queue never paused: not_paused');
SELECT is((SELECT count(*) FROM runrelay.list_paused_queues()), 0::bigint, 'no queue is paused');
SELECT is(pg_temp.claimed(NULL), ARRAY['a1', 'a2'], 'claims take the resumed queue''s runs again, best first');
SELECT is(runrelay.pause_queue('empty-queue'), 'paused', 'a queue with no run can be paused');
SELECT is(runrelay.resume_queue('empty-queue'), 'resumed', '... and resumed');

-- Bad input.
SELECT throws_ok($$SELECT runrelay.pause_queue(NULL)$$, '22023', NULL, 'pause: null queue');
SELECT throws_ok($$SELECT runrelay.pause_queue('  ')$$, '22023', NULL, 'pause: blank queue');
SELECT throws_ok($$SELECT runrelay.pause_queue('q', repeat('r', 2001))$$, '22023', NULL, 'pause: a reason over 2000 characters');
SELECT throws_ok($$SELECT runrelay.pause_queue('q', requested_by => '')$$, '22023', NULL, 'pause: an empty requested_by');
SELECT throws_ok($$SELECT runrelay.resume_queue(repeat('q', 201))$$, '22023', NULL, 'resume: a queue over 200 characters');

SELECT * FROM finish();
ROLLBACK;
