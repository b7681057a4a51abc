-- Named tasks: enqueue_run's task and enqueue_runs' task key set runs.task
-- (the identifier rules of a queue; part of a run's identity for replays);
-- claim_attempts and settle_and_claim take only runs of their tasks filter,
-- with or without a queue list, and return task and steps; a bad task or
-- tasks list is 22023 and changes nothing.
BEGIN;
SELECT plan(30);

-- Enqueue.
SELECT is(
    (SELECT created FROM runrelay.enqueue_run(run_id => 'm1', queue => 'mail', task => 'send_email')),
    TRUE, 'enqueue_run: a run of a task'
);
SELECT is((
    SELECT task FROM runrelay.runs
    WHERE run_id = 'm1'
), 'send_email', 'enqueue_run: runs.task is set');
SELECT is((SELECT task FROM runrelay.get_run('m1')), 'send_email', 'get_run: the run''s task');
SELECT is(
    (SELECT created FROM runrelay.enqueue_run(run_id => 'm1', queue => 'mail', task => 'send_email')),
    FALSE, 'enqueue_run: the same run again is a replay'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'm1', queue => 'mail', task => 'other')$$, '22023',
    'runrelay: invalid run_id: run "m1" already exists with a different queue or payload (or task)',
    'enqueue_run: the same run_id with another task is a conflict'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'm1', queue => 'mail')$$, '22023', NULL,
    'enqueue_run: the same run_id untyped is a conflict'
);
CREATE TEMP TABLE before_bad AS SELECT count(*) AS n FROM runrelay.runs;
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', task => '')$$, '22023', NULL, 'enqueue_run: an empty task'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b2', task => E'\u00a0 ')$$, '22023', NULL, 'enqueue_run: a blank task'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b3', task => E'send\nemail')$$, '22023', NULL,
    'enqueue_run: a control character in task'
);
SELECT throws_like(
    $$SELECT runrelay.enqueue_run(run_id => 'b4', task => repeat('t', 201))$$, '%invalid task%',
    'enqueue_run: a task of 201 characters, named in the error'
);
SELECT is(
    (SELECT count(*) FROM runrelay.runs), (SELECT n FROM before_bad), 'a refused enqueue wrote nothing'
);
SELECT results_eq(
    $$SELECT run_id, created FROM runrelay.enqueue_runs(
        '[{"run_id": "m2", "queue": "mail", "task": "send_email"}, {"run_id": "u1", "queue": "mail"},
          {"run_id": "r1", "queue": "reports", "task": "send_email"}, {"run_id": "c1", "queue": "mail", "task": "charge"}]'
    )$$,
    $$VALUES ('m2', TRUE), ('u1', TRUE), ('r1', TRUE), ('c1', TRUE)$$,
    'enqueue_runs: items with and without a task'
);
SELECT results_eq(
    $$SELECT run_id, task FROM runrelay.runs WHERE run_id IN ('m2', 'u1', 'r1', 'c1') ORDER BY run_id$$,
    $$VALUES ('c1', 'charge'), ('m2', 'send_email'), ('r1', 'send_email'), ('u1', NULL)$$,
    'enqueue_runs: each item''s task is kept'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "b5"}, {"run_id": "b6", "task": ""}]')$$,
    '%invalid items[1].task%', 'enqueue_runs: a bad task is named with its item'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "b7", "task": 3}]')$$,
    '%invalid items[0].task: must be a JSON string%', 'enqueue_runs: a task that is not a string'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "m2", "queue": "mail", "task": "charge"}]')$$, '22023', NULL,
    'enqueue_runs: an existing run with another task is a conflict'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs
        WHERE run_id LIKE 'b%'
    ), 0::bigint, 'the refused items wrote nothing'
);

-- Claims with a tasks filter.
SELECT throws_like(
    $$SELECT * FROM runrelay.claim_attempts('w', tasks => '{}')$$, '%invalid tasks%', 'claim_attempts: an empty tasks list'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.claim_attempts('w', tasks => ARRAY['ok', ''])$$, '%invalid tasks%',
    'claim_attempts: a blank task name'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.claim_attempts('w', tasks => ARRAY[NULL::text])$$, '%invalid tasks%',
    'claim_attempts: a null task name'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.settle_and_claim('[]', 'w', tasks => '{}')$$, '%invalid tasks%',
    'settle_and_claim: an empty tasks list'
);
SELECT is(
    (SELECT count(*) FROM runrelay.attempts), 0::bigint, 'the refused claims opened nothing'
);
SELECT results_eq(
    $$SELECT run_id, queue, task, steps FROM runrelay.claim_attempts('w1', ARRAY['mail'], 10, tasks => ARRAY['send_email'])
      ORDER BY run_id$$,
    $$VALUES ('m1', 'mail', 'send_email', NULL::jsonb), ('m2', 'mail', 'send_email', NULL::jsonb)$$,
    'claim_attempts: only runs of the task, on the queues, with the task and no steps'
);
SELECT results_eq(
    $$SELECT run_id, task FROM runrelay.claim_attempts('w1', NULL, 10, tasks => ARRAY['send_email', 'nobody'])$$,
    $$VALUES ('r1', 'send_email')$$,
    'claim_attempts: without a queue list, the task''s runs on every queue'
);
SELECT runrelay.pause_queue('mail');
SELECT is(
    (SELECT count(*) FROM runrelay.claim_attempts('w1', NULL, 10, tasks => ARRAY['charge'])), 0::bigint,
    'claim_attempts: a paused queue''s runs of the task are not claimed'
);
SELECT runrelay.resume_queue('mail');
SELECT results_eq(
    $$SELECT kind, run_id, task, steps FROM runrelay.settle_and_claim('[]', 'w2', ARRAY['mail'], 5, tasks => ARRAY['charge'])$$,
    $$VALUES ('claimed', 'c1', 'charge', NULL::jsonb)$$,
    'settle_and_claim: claims only runs of its tasks, with the task'
);
SELECT results_eq(
    $$SELECT run_id, task FROM runrelay.claim_attempts('w3', ARRAY['mail'], 10)$$,
    $$VALUES ('u1', NULL::text)$$,
    'claim_attempts: without a filter, any run (the untyped one left)'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs
        WHERE status = 'queued'
    ), 0::bigint, 'every run was claimed once'
);

-- A replayed claim answers the task too.
SELECT runrelay.enqueue_run(run_id => 'rp', queue => 'replay', task => 't');
CREATE TEMP TABLE replay_call AS SELECT gen_random_uuid() AS id;
CREATE TEMP TABLE first_claim AS
SELECT c.* FROM replay_call, runrelay.claim_attempts('w4', ARRAY['replay'], 1, 30, replay_call.id, ARRAY['t']) AS c;
SELECT results_eq(
    $$SELECT c.* FROM replay_call, runrelay.claim_attempts('w4', ARRAY['replay'], 1, 30, replay_call.id, ARRAY['t']) AS c$$,
    $$SELECT * FROM first_claim$$,
    'claim_attempts: a replay answers the first claim, task and steps included'
);
SELECT is((SELECT task FROM first_claim), 't', 'the claimed row carries the run''s task');

SELECT * FROM finish();
ROLLBACK;
