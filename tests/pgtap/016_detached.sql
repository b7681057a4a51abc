-- Detached runners (SPEC §3.2): suspend on a detached_runner wait (its
-- run.waiting / run.resumed are transport-only), record_runner_terminal
-- (recorded, duplicate, conflict, too_late, not_found), read_runner_terminal,
-- claim_detached_terminal and its claim window (a pushed terminal nobody
-- claims ends the wait), fail_attempt's superseded, and a protected waiting
-- failure that must not overwrite a pushed terminal.
BEGIN;
SELECT plan(69);

-- Start a run and suspend its first attempt on a detached runner, with a
-- timeout_at p_timeout from now when given.
CREATE FUNCTION pg_temp.wait_detached(p_run_id text, p_timeout interval DEFAULT NULL)
RETURNS tests.claim
LANGUAGE sql
AS $$
    SELECT tests.start_waiting(
        p_run_id,
        jsonb_strip_nulls(jsonb_build_object('kind', 'detached_runner', 'runner', 'r', 'timeout_at', now() + p_timeout))
    );
$$;

-- claim_detached_terminal by the owner of the run's first attempt.
CREATE FUNCTION pg_temp.owner_claims(p_run_id text)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT runrelay.claim_detached_terminal(p_run_id, 1, tests.token(p_run_id));
$$;

-- The runner pushes p_result and the attempt's owner claims it.
CREATE FUNCTION pg_temp.push_and_claim(p_run_id text, p_result jsonb)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT runrelay.record_runner_terminal(p_run_id, 1, p_result);
    SELECT pg_temp.owner_claims(p_run_id);
$$;

-- What the next claim of the run's queue starts.
CREATE FUNCTION pg_temp.next_claim(p_run_id text)
RETURNS TABLE (run_id text, attempt integer, resume jsonb)
LANGUAGE sql
AS $$
    SELECT c.run_id, c.attempt, c.resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY[p_run_id]) AS c;
$$;

-- The next claim ends the wait: it starts attempt 2 with p_resume.
CREATE FUNCTION pg_temp.wakes(p_run_id text, p_resume jsonb, p_description text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT results_eq(
        format('SELECT * FROM pg_temp.next_claim(%L)', p_run_id),
        format('VALUES (%L, 2, %L::jsonb)', p_run_id, p_resume),
        p_description
    );
$$;

-- reap_expired sends the run's expired first attempt back to waiting.
CREATE FUNCTION pg_temp.reaped(p_run_id text, p_description text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT results_eq(
        format('SELECT * FROM runrelay.reap_expired() WHERE run_id = %L', p_run_id),
        format('VALUES (%L, 1, %L)', p_run_id, 'waiting'),
        p_description
    );
$$;

-- How long a pushed terminal may wait for its claim.
CREATE FUNCTION pg_temp.claim_window(p_run_id text)
RETURNS interval
LANGUAGE sql
AS $$
    SELECT r.wake_at - a.runner_result_received_at
    FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a ON r.run_id = a.run_id
    WHERE r.run_id = p_run_id;
$$;

-- The wait.
SELECT tests.start_run('d1');
SELECT is(
    runrelay.suspend_attempt(
        'd1', 1, tests.token('d1'),
        jsonb_build_object('kind', 'detached_runner', 'runner', 'gpu-7', 'timeout_at', now() + interval '1 hour')
    ),
    'waiting', 'suspend on a detached_runner wait answers waiting'
);
SELECT results_eq(
    $$SELECT r.status, r.wait ->> 'kind', r.wait ->> 'runner', a.status, a.runner_result ->> 'status'
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'd1'$$,
    $$VALUES ('waiting', 'detached_runner', 'gpu-7', 'waiting', 'suspended')$$,
    'the run waits on the runner and the attempt keeps its suspension receipt'
);
SELECT results_eq(
    $$SELECT type, transport_only FROM runrelay.ledger WHERE run_id = 'd1' ORDER BY seq$$,
    $$VALUES ('run.queued', FALSE), ('run.started', FALSE), ('run.waiting', TRUE)$$,
    'run.waiting of a detached_runner wait is transport-only'
);

-- read_runner_terminal before anything was pushed.
SELECT results_eq(
    $$SELECT * FROM runrelay.read_runner_terminal('d1', 1)$$,
    $$VALUES (NULL::jsonb, NULL::timestamptz)$$,
    'before a push, read_runner_terminal returns one row of nulls (the receipt is not a terminal)'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.read_runner_terminal('d1', 2)$$, 'read_runner_terminal of a missing attempt: no row'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.read_runner_terminal('d-none', 1)$$, 'read_runner_terminal of a missing run: no row'
);
SELECT is(pg_temp.owner_claims('d1'), FALSE, 'claim_detached_terminal before a push answers false');
SELECT is(tests.state('d1'), 'waiting:waiting', 'and changes nothing');

-- record_runner_terminal.
SELECT is(
    runrelay.record_runner_terminal('d1', 1, '{"status": "ok", "out": 1}'), 'recorded',
    'the first push answers recorded'
);
SELECT results_eq(
    $$SELECT result, received_at IS NOT NULL FROM runrelay.read_runner_terminal('d1', 1)$$,
    $$VALUES ('{"status": "ok", "out": 1}'::jsonb, TRUE)$$,
    'read_runner_terminal returns the pushed result and when it arrived'
);
SELECT is(tests.state('d1'), 'waiting:waiting', 'a push does not itself end the wait');
SELECT is(tests.event_count('d1'), 3::bigint, 'a push emits nothing');
SELECT is(
    runrelay.record_runner_terminal('d1', 1, '{"out": 1, "status": "ok"}'), 'duplicate',
    'pushing the same result again answers duplicate'
);
SELECT is(
    runrelay.record_runner_terminal('d1', 1, '{"status": "error"}'), 'conflict',
    'pushing a different result answers conflict'
);
SELECT is(
    (SELECT result FROM runrelay.read_runner_terminal('d1', 1)), '{"status": "ok", "out": 1}'::jsonb,
    'the first result is kept'
);
SELECT is(
    pg_temp.claim_window('d1'), interval '5 minutes',
    'a recorded terminal must be claimed within the 5-minute claim window (sooner than this timeout_at)'
);
SELECT tests.set_clock('4 minutes');
SELECT is_empty($$SELECT * FROM pg_temp.next_claim('d1')$$, 'within the claim window a claim does not wake the run');
SELECT tests.set_clock('0');

-- claim_detached_terminal.
SELECT is(
    runrelay.claim_detached_terminal('d1', 1, gen_random_uuid()), FALSE, 'claim_detached_terminal with a wrong token: false'
);
SELECT is(
    runrelay.claim_detached_terminal('d1', 2, tests.token('d1')), FALSE,
    'claim_detached_terminal of an attempt that does not exist: false'
);
SELECT is(tests.state('d1'), 'waiting:waiting', 'failed claims change nothing');
SELECT is(pg_temp.owner_claims('d1'), TRUE, 'the owner claims the pushed terminal: true');
SELECT results_eq(
    $$SELECT r.status, r.wake_at, a.status, a.lease_expires_at - a.heartbeat_at
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'd1'$$,
    $$VALUES ('waiting', NULL::timestamptz, 'running', interval '30 seconds')$$,
    'the waiting attempt is moved to running with a fresh lease; the lease, not the claim window, governs now'
);
SELECT tests.set_clock('6 minutes');
SELECT is_empty($$SELECT * FROM pg_temp.next_claim('d1')$$, 'a claimed terminal is not woken when the claim window would have passed');
SELECT tests.set_clock('0');
SELECT results_eq(
    $$SELECT type, transport_only FROM runrelay.ledger WHERE run_id = 'd1' ORDER BY seq$$,
    $$VALUES ('run.queued', FALSE), ('run.started', FALSE), ('run.waiting', TRUE), ('run.resumed', TRUE)$$,
    'the wait ends with a transport-only run.resumed'
);
SELECT is(pg_temp.owner_claims('d1'), TRUE, 'a replayed claim_detached_terminal answers true');
SELECT is(tests.event_count('d1'), 4::bigint, 'the replay emits no second run.resumed');

-- superseded: the pushed terminal is authoritative.
SELECT is(
    runrelay.fail_attempt('d1', 1, tests.token('d1'), '{"e": "worker gave up"}', preserve_runner_terminal => TRUE),
    'superseded', 'fail_attempt with preserve_runner_terminal after a push answers superseded'
);
SELECT results_eq(
    $$SELECT r.status, r.error, a.status, a.error FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'd1'$$,
    $$VALUES ('waiting', NULL::jsonb, 'running', NULL::jsonb)$$,
    'superseded writes nothing'
);
SELECT is(tests.event_count('d1'), 4::bigint, 'superseded emits nothing');
SELECT is(
    runrelay.complete_attempt('d1', 1, tests.token('d1'), (SELECT result FROM runrelay.read_runner_terminal('d1', 1))),
    'completed', 'the owner writes the runner''s terminal with complete_attempt'
);
SELECT results_eq(
    $$SELECT status, result, wait FROM runrelay.runs WHERE run_id = 'd1'$$,
    $$VALUES ('completed', '{"status": "ok", "out": 1}'::jsonb, NULL::jsonb)$$,
    'the run is completed with the runner''s result'
);
SELECT is(
    tests.lifecycle('d1'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.resumed', 'run.completed'],
    'the lifecycle of a detached run'
);
SELECT is(
    runrelay.record_runner_terminal('d1', 1, '{"status": "ok", "out": 1}'), 'duplicate',
    'the runner repeating its push after the run ended still answers duplicate'
);

-- preserve_runner_terminal without a push fails normally.
SELECT tests.start_run('d2');
SELECT is(
    runrelay.fail_attempt('d2', 1, tests.token('d2'), '{}', retry_at => now(), preserve_runner_terminal => TRUE),
    'retry_scheduled', 'preserve_runner_terminal without a pushed terminal: the failure applies'
);

-- not_found.
SELECT tests.start_run('d3');
SELECT is(
    runrelay.record_runner_terminal('d3', 1, '{}'), 'not_found',
    'a push for an attempt that never waited on a detached runner answers not_found'
);
SELECT is(runrelay.record_runner_terminal('d3', 2, '{}'), 'not_found', 'a push for a missing attempt: not_found');
SELECT is(runrelay.record_runner_terminal('d-none', 1, '{}'), 'not_found', 'a push for a missing run: not_found');
SELECT runrelay.suspend_attempt('d3', 1, tests.token('d3'), '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.record_runner_terminal('d3', 1, '{}'), 'not_found', 'a push for an event wait answers not_found'
);
SELECT is(
    (SELECT received_at FROM runrelay.read_runner_terminal('d3', 1)), NULL::timestamptz,
    'not_found records nothing'
);

-- too_late: the wait timed out and the run moved on.
SELECT pg_temp.wait_detached('d4', '1 minute');
SELECT tests.set_clock('2 minutes');
SELECT pg_temp.wakes(
    'd4', '{"timed_out": true}',
    'a detached wait past timeout_at is woken by the next claim with resume {"timed_out": true}'
);
SELECT is(
    (
        SELECT transport_only FROM runrelay.ledger
        WHERE run_id = 'd4' AND type = 'run.resumed'
    ), TRUE,
    'the run.resumed that ends a detached wait is transport-only'
);
SELECT is(
    runrelay.record_runner_terminal('d4', 1, '{"late": true}'), 'too_late',
    'a push for a wait that timed out answers too_late'
);
SELECT is(
    (SELECT received_at FROM runrelay.read_runner_terminal('d4', 1)), NULL::timestamptz, 'too_late records nothing'
);
SELECT is(
    runrelay.claim_detached_terminal('d4', 1, tests.token('d4', 1)), FALSE,
    'claim_detached_terminal of a timed-out attempt answers false'
);
SELECT tests.set_clock('0');

-- too_late: pushed after timeout_at, before any claim woke the wait. The wait
-- has timed out whether or not a claim has run yet.
SELECT pg_temp.wait_detached('d5', '1 minute');
SELECT tests.set_clock('2 minutes');
SELECT is(
    runrelay.record_runner_terminal('d5', 1, '{"late": true}'), 'too_late',
    'a push after timeout_at answers too_late even before a claim woke the wait'
);
SELECT pg_temp.wakes('d5', '{"timed_out": true}', 'the late push changed nothing: the next claim wakes the run with {"timed_out": true}');
SELECT tests.set_clock('0');

-- too_late: the run was cancelled while waiting.
SELECT pg_temp.wait_detached('d6');
SELECT runrelay.cancel_run('d6');
SELECT is(runrelay.record_runner_terminal('d6', 1, '{}'), 'too_late', 'a push for a cancelled wait answers too_late');
SELECT is(tests.state('d6'), 'cancelled:cancelled', 'the cancelled run is unchanged');

-- claim_detached_terminal with a pending cancellation.
SELECT pg_temp.wait_detached('d7');
SELECT runrelay.record_runner_terminal('d7', 1, '{"ok": true}');
SELECT tests.mark_cancel('d7');
SELECT is(pg_temp.owner_claims('d7'), FALSE, 'claim_detached_terminal answers false when a cancel marker is applied instead');
SELECT is(tests.state('d7'), 'cancelled:cancelled', 'the marker was applied');
SELECT is(
    tests.lifecycle('d7'), ARRAY['run.queued', 'run.started', 'run.waiting', 'run.cancelled'],
    'run.cancelled is emitted, not run.resumed'
);

-- A claimed terminal whose lease expires goes back to waiting.
SELECT pg_temp.wait_detached('d8');
SELECT pg_temp.push_and_claim('d8', '{"ok": true}');
SELECT tests.set_clock('1 minute');
SELECT pg_temp.reaped('d8', 'reap_expired sends an expired claimed-for-terminal attempt back to waiting');
SELECT is(
    pg_temp.claim_window('d8'), interval '5 minutes',
    'the reaped attempt waits again under its claim window'
);
SELECT is(pg_temp.owner_claims('d8'), TRUE, 'its owner can claim the terminal again within the window');

-- A pushed terminal nobody claims: the claim window ends the wait.
SELECT pg_temp.wait_detached('d9');
SELECT runrelay.record_runner_terminal('d9', 1, '{"ok": 9}');
SELECT tests.set_clock('6 minutes');
SELECT is(
    pg_temp.owner_claims('d9'), FALSE,
    'past the claim window claim_detached_terminal answers false, even before a claim woke the run'
);
SELECT is(tests.state('d9'), 'waiting:waiting', 'and changes nothing');
SELECT pg_temp.wakes(
    'd9', '{"timed_out": true, "runner_result": {"ok": 9}}',
    'the next claim wakes the run; its resume carries the unclaimed terminal'
);
SELECT is(tests.state('d9'), 'running:resumed,running', 'the old attempt is resumed, a new one runs');
SELECT results_eq(
    $$SELECT type, transport_only FROM runrelay.ledger WHERE run_id = 'd9' ORDER BY seq$$,
    $$VALUES ('run.queued', FALSE), ('run.started', FALSE), ('run.waiting', TRUE), ('run.resumed', TRUE),
        ('run.started', FALSE)$$,
    'the wait ends with one transport-only run.resumed'
);
SELECT is(pg_temp.owner_claims('d9'), FALSE, 'the old owner can no longer claim the terminal');
SELECT is(
    runrelay.record_runner_terminal('d9', 1, '{"ok": 9}'), 'duplicate', 'the runner repeating its push: duplicate'
);
SELECT tests.set_clock('0');

-- A timeout_at sooner than the claim window bounds it.
SELECT pg_temp.wait_detached('d10', '1 minute');
SELECT runrelay.record_runner_terminal('d10', 1, '{"ok": 10}');
SELECT is(
    (
        SELECT wake_at FROM runrelay.runs
        WHERE run_id = 'd10'
    ), now() + interval '1 minute',
    'with a sooner timeout_at, the claim window ends at timeout_at'
);
SELECT tests.set_clock('2 minutes');
SELECT pg_temp.wakes(
    'd10', '{"timed_out": true, "runner_result": {"ok": 10}}',
    'past timeout_at the next claim wakes the run with the unclaimed terminal'
);
SELECT tests.set_clock('0');

-- A claimed terminal whose owner lapses after the window: reaping restores
-- the deadline, which has passed, and the next claim wakes the run.
SELECT pg_temp.wait_detached('d11');
SELECT pg_temp.push_and_claim('d11', '{"ok": 11}');
SELECT tests.set_clock('6 minutes');
SELECT pg_temp.reaped('d11', 'the lapsed claim is reaped back to waiting');
SELECT pg_temp.wakes('d11', '{"timed_out": true, "runner_result": {"ok": 11}}', 'its claim window is over: the next claim wakes the run');
SELECT tests.set_clock('0');

-- A protected waiting failure never overwrites a pushed terminal, even once
-- the owner has claimed it (the attempt is running again).
SELECT pg_temp.wait_detached('d12');
SELECT pg_temp.push_and_claim('d12', '{"status": "completed"}');
SELECT is(
    runrelay.fail_attempt('d12', 1, tests.token('d12'), '{"e": "gave up"}', protect_waiting_suspension => TRUE),
    'fence_lost', 'a protected failure of a claimed detached terminal answers fence_lost'
);
SELECT results_eq(
    $$SELECT r.status, r.error, a.status, a.runner_result FROM runrelay.runs AS r
      INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'd12'$$,
    $$VALUES ('waiting', NULL::jsonb, 'running', '{"status": "completed"}'::jsonb)$$,
    'and writes nothing: the pushed terminal stands'
);
SELECT is(tests.event_count('d12'), 4::bigint, 'the refused failure emits nothing');
SELECT is(
    runrelay.complete_attempt('d12', 1, tests.token('d12'), '{"status": "completed"}'), 'completed',
    'the owner still writes the runner''s terminal'
);

SELECT * FROM finish();
ROLLBACK;
