-- list_runs (docs/admin.md): runs newest first (created_at, then run_id,
-- descending), every filter alone and combined, keyset pages that neither
-- skip nor repeat a run, running runs merged in, and 22023 for bad input.
BEGIN;
SELECT plan(40);

-- list_runs is installation-wide: start from no runs.
SELECT tests.clear_runs();

CREATE FUNCTION pg_temp.claim(p_queue text)
RETURNS tests.claim
LANGUAGE sql
AS $$
    SELECT c.run_id, c.attempt, c.lease_token
    FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY[p_queue]) AS c;
$$;

-- The fixture, in clock order (run_at in the past: the claims run on the
-- shifted clock): a1 completed, a2 failed, b1 and b2 queued
-- behind key k1 (b2 held), a3 running, b3 waiting, c1 cancelled.
SELECT tests.set_clock('-5 hours');
SELECT runrelay.enqueue_run('a1', 'qa', run_at => now() - interval '1 day');
SELECT tests.set_clock('-270 minutes');
SELECT runrelay.complete_attempt(c.run_id, c.attempt, c.lease_token) FROM pg_temp.claim('qa') AS c;
SELECT tests.set_clock('-4 hours');
SELECT runrelay.enqueue_run('a2', 'qa', run_at => now() - interval '1 day', max_attempts => 1);
SELECT runrelay.fail_attempt(c.run_id, c.attempt, c.lease_token, '{"boom": 1}') FROM pg_temp.claim('qa') AS c;
SELECT tests.set_clock('-3 hours');
SELECT runrelay.enqueue_run('b1', 'qb', concurrency_key => 'k1');
SELECT tests.set_clock('-2 hours');
SELECT runrelay.enqueue_run('b2', 'qb', concurrency_key => 'k1');
SELECT tests.set_clock('-1 hours');
SELECT runrelay.enqueue_run('a3', 'qa', run_at => now() - interval '1 day');
SELECT pg_temp.claim('qa');
SELECT tests.set_clock('-30 minutes');
SELECT runrelay.enqueue_run('b3', 'qb', run_at => now() - interval '1 day', priority => 10);
SELECT runrelay.suspend_attempt(c.run_id, c.attempt, c.lease_token, '{"kind": "sleep", "until": "2100-01-01T00:00:00Z"}')
FROM pg_temp.claim('qb') AS c;
SELECT tests.set_clock('-10 minutes');
SELECT runrelay.enqueue_run('c1', 'qa');
SELECT runrelay.cancel_run('c1', 'no longer needed');
SELECT tests.set_clock('0');

SELECT is(
    array(SELECT l.run_id || '=' || l.status FROM runrelay.list_runs() AS l),
    ARRAY['c1=cancelled', 'b3=waiting', 'a3=running', 'b2=queued', 'b1=queued', 'a2=failed', 'a1=completed'],
    'every run, newest first, running and waiting ones included'
);

-- Status.
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'queued') AS l), ARRAY['b2', 'b1'], 'status queued');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'running') AS l), ARRAY['a3'], 'status running');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'waiting') AS l), ARRAY['b3'], 'status waiting');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'completed') AS l), ARRAY['a1'], 'status completed');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'failed') AS l), ARRAY['a2'], 'status failed');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(status => 'cancelled') AS l), ARRAY['c1'], 'status cancelled');

-- Queue, and queue with status.
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(queue => 'qa') AS l), ARRAY['c1', 'a3', 'a2', 'a1'], 'queue qa');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(queue => 'qb') AS l), ARRAY['b3', 'b2', 'b1'], 'queue qb');
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(queue => 'qa', status => 'running') AS l), ARRAY['a3'],
    'queue and status running'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(queue => 'qb', status => 'running') AS l), '{}'::text[],
    'no running run in qb'
);
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(queue => 'nowhere') AS l), '{}'::text[], 'an unknown queue: no rows');

-- Concurrency key, alone and with the other filters.
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(concurrency_key => 'k1') AS l), ARRAY['b2', 'b1'], 'key k1');
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(concurrency_key => 'k1', status => 'queued', queue => 'qb') AS l),
    ARRAY['b2', 'b1'],
    'key, status and queue'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(concurrency_key => 'k1', queue => 'qa') AS l), '{}'::text[],
    'key with another queue: no rows'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(concurrency_key => 'k1', max_rows => 1) AS l), ARRAY['b2'],
    'key, one row'
);
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            concurrency_key => 'k1', after_created_at => (
                SELECT r.created_at FROM runrelay.runs AS r
                WHERE r.run_id = 'b2'
            ),
            after_run_id => 'b2'
        ) AS l
    ),
    ARRAY['b1'],
    'key, the page after b2'
);

-- Age bounds.
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(created_after => now() - interval '150 minutes') AS l),
    ARRAY['c1', 'b3', 'a3', 'b2'],
    'created_after'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(created_before => now() - interval '150 minutes') AS l),
    ARRAY['b1', 'a2', 'a1'],
    'created_before'
);
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            created_after => now() - interval '270 minutes', created_before => now() - interval '45 minutes'
        ) AS l
    ),
    ARRAY['a3', 'b2', 'b1', 'a2'],
    'created_after and created_before together'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(finished_before => now() - interval '1 hour') AS l),
    ARRAY['a2', 'a1'],
    'finished_before: runs that ended before the bound'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(finished_before => now()) AS l),
    ARRAY['c1', 'a2', 'a1'],
    'finished_before now: every ended run'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(finished_before => now(), status => 'running') AS l),
    '{}'::text[],
    'finished_before with a live status: no rows'
);
SELECT is(
    array(SELECT l.run_id FROM runrelay.list_runs(finished_before => now() - interval '250 minutes', queue => 'qa') AS l),
    ARRAY['a1'],
    'finished_before with a queue'
);

-- Pages: each starts after the last row of the one before, none skips or
-- repeats a run, running runs included.
CREATE TEMPORARY TABLE page1 ON COMMIT DROP AS SELECT * FROM runrelay.list_runs(max_rows => 3);
SELECT is(array(SELECT p.run_id FROM page1 AS p), ARRAY['c1', 'b3', 'a3'], 'page 1');
CREATE TEMPORARY TABLE page2 ON COMMIT DROP AS
SELECT l.* FROM runrelay.list_runs(
    max_rows => 3,
    after_created_at => (
        SELECT p.created_at FROM page1 AS p
        WHERE p.run_id = 'a3'
    ),
    after_run_id => 'a3'
) AS l;
SELECT is(array(SELECT p.run_id FROM page2 AS p), ARRAY['b2', 'b1', 'a2'], 'page 2');
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            max_rows => 3,
            after_created_at => (
                SELECT p.created_at FROM page2 AS p
                WHERE p.run_id = 'a2'
            ),
            after_run_id => 'a2'
        ) AS l
    ),
    ARRAY['a1'],
    'page 3, the last'
);
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            after_created_at => (
                SELECT r.created_at FROM runrelay.runs AS r
                WHERE r.run_id = 'a1'
            ),
            after_run_id => 'a1'
        ) AS l
    ),
    '{}'::text[],
    'after the oldest run: an empty page'
);
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            max_rows => 1,
            after_created_at => (
                SELECT r.created_at FROM runrelay.runs AS r
                WHERE r.run_id = 'b3'
            ),
            after_run_id => 'b3'
        ) AS l
    ),
    ARRAY['a3'],
    'a page that starts at a running run'
);

-- Runs created in one statement share created_at: run_id breaks the tie.
SELECT runrelay.enqueue_runs('[{"run_id": "t1", "queue": "qt"}, {"run_id": "t3", "queue": "qt"}, {"run_id": "t2", "queue": "qt"}]');
SELECT is(array(SELECT l.run_id FROM runrelay.list_runs(queue => 'qt', max_rows => 2) AS l), ARRAY['t3', 't2'], 'a tie: run_id descending');
SELECT is(
    array(
        SELECT l.run_id FROM runrelay.list_runs(
            queue => 'qt', after_created_at => (
                SELECT r.created_at FROM runrelay.runs AS r
                WHERE r.run_id = 't2'
            ), after_run_id => 't2'
        ) AS l
    ),
    ARRAY['t1'],
    'the page after a tie continues inside it'
);

-- The row.
SELECT results_eq(
    $$SELECT queue, status, priority, concurrency_key, key_held, attempt_count, max_attempts, wait, error, finished_at IS NULL
      FROM runrelay.list_runs(concurrency_key => 'k1', max_rows => 1)$$,
    $$VALUES ('qb', 'queued', 0, 'k1', TRUE, 0, 3, NULL::jsonb, NULL::jsonb, TRUE)$$,
    'a queued run held behind its key'
);
SELECT results_eq(
    $$SELECT status, attempt_count, error,
             finished_at BETWEEN now() - interval '4 hours' AND statement_timestamp() - interval '4 hours'
      FROM runrelay.list_runs(status => 'failed')$$,
    $$VALUES ('failed', 1, '{"boom": 1}'::jsonb, TRUE)$$,
    'a failed run with its error and end'
);

-- Bad input.
SELECT throws_ok($$SELECT * FROM runrelay.list_runs(status => 'done')$$, '22023', NULL, 'an unknown status');
SELECT throws_ok($$SELECT * FROM runrelay.list_runs(queue => '')$$, '22023', NULL, 'an empty queue');
SELECT throws_ok($$SELECT * FROM runrelay.list_runs(concurrency_key => repeat('k', 201))$$, '22023', NULL, 'a key over 200 characters');
SELECT throws_ok(
    $$SELECT * FROM runrelay.list_runs(after_run_id => 'a1')$$,
    '22023',
    'runrelay: invalid after_created_at: must be given together with after_run_id',
    'after_run_id without after_created_at'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.list_runs(after_created_at => now())$$,
    '22023',
    'runrelay: invalid after_run_id: must be given together with after_created_at',
    'after_created_at without after_run_id'
);
SELECT throws_ok($$SELECT * FROM runrelay.list_runs(max_rows => 0)$$, '22023', NULL, 'max_rows 0');
SELECT throws_ok($$SELECT * FROM runrelay.list_runs(created_after => 'infinity')$$, '22023', NULL, 'an infinite created_after');

SELECT * FROM finish();
ROLLBACK;
