-- heartbeat, complete_attempt and complete_attempts (SPEC §3.2): every
-- outcome, fences, lease clamping, replays, cancellation learned at the next
-- write, and final_events ordered before run.completed.
BEGIN;
SELECT plan(54);

-- heartbeat: ok.
SELECT tests.start_run('h1');
SELECT tests.set_clock('10 seconds');
CREATE TEMP TABLE beat AS SELECT * FROM runrelay.heartbeat('h1', 1, tests.token('h1'), 60);
SELECT results_eq(
    $$SELECT b.outcome, b.lease_expires_at = a.lease_expires_at
      FROM beat AS b CROSS JOIN runrelay.attempts AS a WHERE a.run_id = 'h1'$$,
    $$VALUES ('ok', TRUE)$$,
    'heartbeat answers ok with the new lease expiry it stored'
);
SELECT results_eq(
    $$SELECT lease_expires_at - heartbeat_at, heartbeat_at > claimed_at FROM runrelay.attempts WHERE run_id = 'h1'$$,
    $$VALUES (interval '60 seconds', TRUE)$$,
    'heartbeat extends the lease to now + lease_seconds and records heartbeat_at'
);
SELECT runrelay.heartbeat('h1', 1, tests.token('h1'), 1);
SELECT is(
    (
        SELECT lease_expires_at - heartbeat_at FROM runrelay.attempts
        WHERE run_id = 'h1'
    ), interval '5 seconds',
    'heartbeat clamps lease_seconds below 5 to 5'
);
SELECT runrelay.heartbeat('h1', 1, tests.token('h1'), 100000);
SELECT is(
    (
        SELECT lease_expires_at - heartbeat_at FROM runrelay.attempts
        WHERE run_id = 'h1'
    ), interval '300 seconds',
    'heartbeat clamps lease_seconds above 300 to 300'
);
SELECT tests.set_clock('1 hour');
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('h1', 1, tests.token('h1'))), 'ok',
    'an expired lease that was not reaped still passes the fence'
);
SELECT tests.set_clock('0');
SELECT is(tests.lifecycle('h1'), ARRAY['run.queued', 'run.started'], 'heartbeats emit no ledger event');

-- heartbeat: fence_lost.
SELECT results_eq(
    $$SELECT * FROM runrelay.heartbeat('h1', 1, gen_random_uuid())$$,
    $$VALUES ('fence_lost', NULL::timestamptz)$$,
    'heartbeat with a wrong token answers fence_lost and no expiry'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('h1', 2, tests.token('h1'))), 'fence_lost',
    'heartbeat for an attempt that does not exist answers fence_lost'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('nope', 1, tests.token('h1'))), 'fence_lost',
    'heartbeat for a run that does not exist answers fence_lost'
);
SELECT is(
    (
        SELECT lease_expires_at - heartbeat_at FROM runrelay.attempts
        WHERE run_id = 'h1'
    ), interval '30 seconds',
    'a fenced-out heartbeat does not touch the lease'
);

-- complete_attempt: completed, with final_events before run.completed.
SELECT is(
    runrelay.complete_attempt(
        'h1', 1, tests.token('h1'), '{"answer": 42}',
        '[{"type": "app.done", "payload": {"x": 1}}, {"type": "app.log", "lane": "observability"}]'
    ),
    'completed', 'complete_attempt on the live attempt answers completed'
);
SELECT results_eq(
    $$SELECT r.status, r.result, r.finished_at IS NOT NULL, r.wait, a.status, a.finished_at IS NOT NULL
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'h1'$$,
    $$VALUES ('completed', '{"answer": 42}'::jsonb, TRUE, NULL::jsonb, 'completed', TRUE)$$,
    'the run is completed with its result and finished_at; the attempt is completed'
);
SELECT results_eq(
    $$SELECT type, lane FROM runrelay.ledger WHERE run_id = 'h1' ORDER BY seq$$,
    $$VALUES ('run.queued', 'lifecycle'), ('run.started', 'lifecycle'), ('app.done', 'lifecycle'),
             ('app.log', 'observability'), ('run.completed', 'lifecycle')$$,
    'final_events are appended, in order, before run.completed'
);
SELECT is(
    (
        SELECT payload FROM runrelay.ledger
        WHERE run_id = 'h1' AND type = 'app.done'
    ), '{"x": 1}'::jsonb,
    'a final event keeps its payload'
);

-- complete_attempt: replay.
SELECT is(
    runrelay.complete_attempt('h1', 1, tests.token('h1'), '{"answer": 42}', '[{"type": "app.done"}]'),
    'completed', 'a replayed complete_attempt answers completed again (not fence_lost)'
);
SELECT is(tests.event_count('h1'), 5::bigint, 'the replay appends nothing (no second final event or run.completed)');
SELECT is(
    (
        SELECT result FROM runrelay.runs
        WHERE run_id = 'h1'
    ), '{"answer": 42}'::jsonb, 'the replay changes no result'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('h1', 1, tests.token('h1'))), 'fence_lost',
    'a heartbeat after completion answers fence_lost'
);

-- complete_attempt: fence_lost.
SELECT tests.start_run('h2');
SELECT is(
    runrelay.complete_attempt('h2', 1, gen_random_uuid()), 'fence_lost', 'complete with a wrong token answers fence_lost'
);
SELECT is(
    runrelay.complete_attempt('h2', 2, tests.token('h2')), 'fence_lost',
    'complete for an attempt that does not exist answers fence_lost'
);
SELECT is(
    runrelay.complete_attempt('nope', 1, tests.token('h2')), 'fence_lost',
    'complete for a run that does not exist answers fence_lost'
);
SELECT is(tests.state('h2'), 'running:running', 'fenced-out completions change nothing');
SELECT is(tests.event_count('h2'), 2::bigint, 'fenced-out completions emit nothing');
SELECT is(
    runrelay.fail_attempt('h2', 1, tests.token('h2'), '{"e": 1}', retry_at => now()), 'retry_scheduled',
    'fixture: attempt 1 fails and the run retries'
);
SELECT tests.claim_run('h2');
SELECT is(
    runrelay.complete_attempt('h2', 1, tests.token('h2', 1)), 'fence_lost',
    'complete of a superseded attempt with its own token answers fence_lost'
);
SELECT is(
    runrelay.complete_attempt('h2', 2, tests.token('h2', 1)), 'fence_lost',
    'the current attempt with an old attempt''s token answers fence_lost'
);
SELECT is(tests.state('h2'), 'running:failed,running', 'the current attempt is untouched');
SELECT tests.start_waiting('h3', '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.complete_attempt('h3', 1, tests.token('h3')), 'fence_lost',
    'complete of a waiting (suspended) attempt answers fence_lost'
);

-- Cancellation learned at the next heartbeat or write.
SELECT tests.start_run('hc');
SELECT tests.mark_cancel('hc', 'user asked');
SELECT results_eq(
    $$SELECT * FROM runrelay.heartbeat('hc', 1, tests.token('hc'))$$,
    $$VALUES ('cancelled', NULL::timestamptz)$$,
    'heartbeat answers cancelled when a cancel marker exists'
);
SELECT is(tests.state('hc'), 'cancelled:cancelled', 'the heartbeat applied the marker: run and attempt are cancelled');
SELECT is(tests.lifecycle('hc'), ARRAY['run.queued', 'run.started', 'run.cancelled'], 'run.cancelled is emitted');
SELECT is(
    (
        SELECT payload ->> 'reason' FROM runrelay.ledger
        WHERE run_id = 'hc' AND type = 'run.cancelled'
    ), 'user asked',
    'run.cancelled carries the marker''s reason'
);
SELECT is(
    (SELECT outcome FROM runrelay.heartbeat('hc', 1, tests.token('hc'))), 'cancelled',
    'a later heartbeat of the cancelled attempt also answers cancelled'
);
SELECT is(
    runrelay.complete_attempt('hc', 1, tests.token('hc')), 'cancelled',
    'a later complete of the cancelled attempt answers cancelled'
);
SELECT is(tests.event_count('hc'), 3::bigint, 'writes after cancellation emit nothing');

SELECT tests.start_run('cc');
SELECT tests.mark_cancel('cc');
SELECT is(
    runrelay.complete_attempt('cc', 1, tests.token('cc'), '{"r": 1}', '[{"type": "app.done"}]'), 'cancelled',
    'complete_attempt answers cancelled when a cancel marker won'
);
SELECT results_eq(
    $$SELECT status, result FROM runrelay.runs WHERE run_id = 'cc'$$,
    $$VALUES ('cancelled', NULL::jsonb)$$,
    'the run is cancelled and the result is not stored'
);
SELECT is(
    tests.lifecycle('cc'), ARRAY['run.queued', 'run.started', 'run.cancelled'],
    'no final event and no run.completed when the marker wins'
);
SELECT is(
    runrelay.complete_attempt('cc', 1, tests.token('cc'), '{"r": 1}'), 'cancelled', 'the replay answers cancelled'
);

-- complete_attempts: each item decided independently.
SELECT tests.start_run('b1');
SELECT tests.start_run('b2');
SELECT tests.start_run('b3');
SELECT tests.start_run('b4');
SELECT tests.mark_cancel('b4');
CREATE TEMP TABLE batch AS
SELECT jsonb_build_array(
    jsonb_build_object('run_id', 'b2', 'attempt', 1, 'lease_token', tests.token('b2'), 'result', '{"v": 2}'::jsonb),
    jsonb_build_object('run_id', 'b1', 'attempt', 1, 'lease_token', tests.token('b1')),
    jsonb_build_object('run_id', 'b3', 'attempt', 1, 'lease_token', gen_random_uuid()),
    jsonb_build_object('run_id', 'b4', 'attempt', 1, 'lease_token', tests.token('b4')),
    jsonb_build_object('run_id', 'b-none', 'attempt', 1, 'lease_token', gen_random_uuid())
) AS items;
SELECT set_eq(
    $$SELECT * FROM runrelay.complete_attempts((SELECT items FROM batch))$$,
    $$VALUES ('b1', 1, 'completed'), ('b2', 1, 'completed'), ('b3', 1, 'fence_lost'),
             ('b4', 1, 'cancelled'), ('b-none', 1, 'fence_lost')$$,
    'complete_attempts answers completed, fence_lost and cancelled per item'
);
SELECT results_eq(
    $$SELECT run_id, status, result FROM runrelay.runs WHERE run_id IN ('b1', 'b2', 'b3', 'b4') ORDER BY run_id$$,
    $$VALUES ('b1', 'completed', '{}'::jsonb), ('b2', 'completed', '{"v": 2}'::jsonb),
             ('b3', 'running', NULL::jsonb), ('b4', 'cancelled', NULL::jsonb)$$,
    'each item took effect as complete_attempt would (result defaults to {})'
);
SELECT is(
    ARRAY[tests.lifecycle('b1'), tests.lifecycle('b4')],
    ARRAY[ARRAY['run.queued', 'run.started', 'run.completed'], ARRAY['run.queued', 'run.started', 'run.cancelled']],
    'complete_attempts emits run.completed / run.cancelled per item'
);
SELECT set_eq(
    $$SELECT * FROM runrelay.complete_attempts((SELECT items FROM batch))$$,
    $$VALUES ('b1', 1, 'completed'), ('b2', 1, 'completed'), ('b3', 1, 'fence_lost'),
             ('b4', 1, 'cancelled'), ('b-none', 1, 'fence_lost')$$,
    'a replayed batch answers the same outcomes'
);
SELECT is(
    tests.event_count('b1') + tests.event_count('b2') + tests.event_count('b3') + tests.event_count('b4'), 11::bigint,
    'a replayed batch emits nothing'
);
SELECT is_empty($$SELECT * FROM runrelay.complete_attempts('[]')$$, 'an empty batch answers no rows');

-- complete_attempt is a one-item use of the completion routine and
-- complete_attempts a batch of it; a batch must give complete_attempt's
-- answers and effects. Twin runs per case: s-* completed one by one, m-* in
-- one batch.
CREATE TEMP TABLE twin (name text, s_outcome text, m_outcome text);
CREATE FUNCTION pg_temp.prepare_twin(p_run_id text, p_case text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_case = 'keyed' THEN
        PERFORM tests.start_run(p_run_id, 3, 'key-' || p_run_id);
        PERFORM runrelay.enqueue_run(
            run_id => p_run_id || '-next', queue => p_run_id || '-next', concurrency_key => 'key-' || p_run_id
        );
    ELSIF p_case = 'stale' THEN
        PERFORM tests.start_run(p_run_id);
        PERFORM runrelay.fail_attempt(p_run_id, 1, tests.token(p_run_id), '{}', retry_at => now());
        PERFORM tests.claim_run(p_run_id);
    ELSIF p_case = 'replay' THEN
        PERFORM tests.start_run(p_run_id);
        PERFORM runrelay.complete_attempt(p_run_id, 1, tests.token(p_run_id), '{"first": true}');
    ELSIF p_case = 'marker' THEN
        PERFORM tests.start_run(p_run_id);
        PERFORM tests.mark_cancel(p_run_id);
    ELSIF p_case = 'cancelled' THEN
        PERFORM tests.start_run(p_run_id);
        PERFORM runrelay.cancel_run(p_run_id, 'stop');
    ELSIF p_case = 'prepared' THEN
        PERFORM tests.start_waiting(p_run_id, '{"kind": "event", "name": "go"}');
        PERFORM runrelay.prepare_waiting_failure(p_run_id, 1, tests.token(p_run_id));
    ELSE
        PERFORM tests.start_run(p_run_id);
    END IF;
END;
$$;
INSERT INTO twin (name)
VALUES ('plain'), ('plain2'), ('keyed'), ('stale'), ('replay'), ('marker'), ('cancelled'), ('prepared');
SELECT
    pg_temp.prepare_twin('s-' || name, name) AS single,
    pg_temp.prepare_twin('m-' || name, name) AS batched
FROM twin;
UPDATE twin SET s_outcome = runrelay.complete_attempt('s-' || name, 1, tests.token('s-' || name), '{"v": 1}');
UPDATE twin AS t SET m_outcome = b.outcome
FROM
    runrelay.complete_attempts((
        SELECT
            jsonb_agg(jsonb_build_object(
                'run_id', 'm-' || name, 'attempt', 1, 'lease_token', tests.token('m-' || name), 'result', '{"v": 1}'::jsonb
            ) ORDER BY name DESC)
        FROM twin
    )) AS b
WHERE b.run_id = 'm-' || t.name;
SELECT results_eq(
    $$SELECT name, m_outcome FROM twin ORDER BY name$$,
    $$SELECT name, s_outcome FROM twin ORDER BY name$$,
    'every item of a batch answers what complete_attempt answers for the same state'
);
SELECT results_eq(
    $$SELECT name, m_outcome FROM twin ORDER BY name$$,
    $$VALUES ('cancelled', 'cancelled'), ('keyed', 'completed'), ('marker', 'cancelled'), ('plain', 'completed'),
             ('plain2', 'completed'), ('prepared', 'completed'), ('replay', 'completed'), ('stale', 'fence_lost')$$,
    'the cases cover completed, replayed, fence_lost and both kinds of cancellation'
);
SELECT results_eq(
    $$SELECT t.name, tests.state('m-' || t.name), r.result, r.wait, r.key_held, r.finished_at IS NULL
      FROM twin AS t INNER JOIN runrelay.runs AS r ON r.run_id = 'm-' || t.name ORDER BY t.name$$,
    $$SELECT t.name, tests.state('s-' || t.name), r.result, r.wait, r.key_held, r.finished_at IS NULL
      FROM twin AS t INNER JOIN runrelay.runs AS r ON r.run_id = 's-' || t.name ORDER BY t.name$$,
    'runs and attempts end in the same states'
);
SELECT results_eq(
    $$SELECT t.name, a.attempt, a.status, a.outcome, a.outcome_op, a.finished_at IS NULL
      FROM twin AS t INNER JOIN runrelay.attempts AS a ON a.run_id = 'm-' || t.name ORDER BY t.name, a.attempt$$,
    $$SELECT t.name, a.attempt, a.status, a.outcome, a.outcome_op, a.finished_at IS NULL
      FROM twin AS t INNER JOIN runrelay.attempts AS a ON a.run_id = 's-' || t.name ORDER BY t.name, a.attempt$$,
    'attempts record the same outcomes (what a later replay answers)'
);
SELECT results_eq(
    $$SELECT t.name, l.seq, l.type, l.payload - 'queue' - 'concurrency_key', l.state, l.delivery_key = l.run_id || ':' || l.seq
      FROM twin AS t INNER JOIN runrelay.ledger AS l ON l.run_id = 'm-' || t.name ORDER BY t.name, l.seq$$,
    $$SELECT t.name, l.seq, l.type, l.payload - 'queue' - 'concurrency_key', l.state, l.delivery_key = l.run_id || ':' || l.seq
      FROM twin AS t INNER JOIN runrelay.ledger AS l ON l.run_id = 's-' || t.name ORDER BY t.name, l.seq$$,
    'the same lifecycle events, seqs, payloads (but the run''s own queue and key) and default delivery keys'
);
SELECT results_eq(
    $$SELECT t.name, ll.lane, ll.head_seq, ll.available_at IS NULL, ll.blocked
      FROM twin AS t INNER JOIN runrelay.ledger_lanes AS ll ON ll.run_id = 'm-' || t.name ORDER BY t.name$$,
    $$SELECT t.name, ll.lane, ll.head_seq, ll.available_at IS NULL, ll.blocked
      FROM twin AS t INNER JOIN runrelay.ledger_lanes AS ll ON ll.run_id = 's-' || t.name ORDER BY t.name$$,
    'the same ledger lanes'
);
SELECT results_eq(
    $$SELECT r.key_held FROM runrelay.runs AS r WHERE r.run_id IN ('s-keyed-next', 'm-keyed-next') ORDER BY r.run_id$$,
    $$VALUES (FALSE), (FALSE)$$,
    'completing a keyed run in a batch promotes the next run of its key'
);
SELECT is_empty(
    $$SELECT 1 FROM runrelay.cancellations WHERE run_id LIKE 'm-%' AND run_id <> 'm-marker'$$,
    'no cancel marker is left behind by the batch'
);
SELECT results_eq(
    $$SELECT run_id FROM runrelay.complete_attempts((
        SELECT jsonb_agg(jsonb_build_object('run_id', 'm-' || name, 'attempt', 1, 'lease_token', tests.token('m-' || name)))
        FROM twin
    ))$$,
    $$SELECT 'm-' || name FROM twin ORDER BY ('m-' || name) COLLATE "C"$$,
    'results come in run_id order (the order the batch locks in)'
);

SELECT * FROM finish();
ROLLBACK;
