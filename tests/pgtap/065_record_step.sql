-- record_step: a step's result is stored once per run from the live attempt
-- (recorded; already_recorded keeps the first; cancelled; fence_lost), every
-- claim returns the run's steps, they survive a retry, a wake, a release
-- and a reap, and go with the run; a repeat answers the same and writes
-- nothing; bad input is 22023 or 54000 and writes nothing; step.recorded
-- events are the engine's alone.
BEGIN;
SELECT plan(34);

SELECT tests.clear_runs();

-- The steps a claim of the run returns (claims it from its own queue).
CREATE FUNCTION pg_temp.claimed_steps(p_run_id text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT c.steps FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY[p_run_id]) AS c;
$$;

CREATE FUNCTION pg_temp.steps_state(p_run_id text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT coalesce(string_agg(s.step || '=' || s.result::text || '@' || s.attempt, ',' ORDER BY s.position), '')
        || '|' || tests.event_count(p_run_id)
    FROM runrelay.steps AS s WHERE s.run_id = p_run_id;
$$;

SELECT tests.start_run('s1');
SELECT is(
    runrelay.record_step('s1', 1, tests.token('s1'), 'charge', '{"id": "ch_1"}'), 'recorded',
    'recorded: the live attempt stores a step'
);
SELECT results_eq(
    $$SELECT lane, type, payload FROM runrelay.ledger WHERE run_id = 's1' AND type = 'step.recorded'$$,
    $$VALUES ('observability', 'step.recorded', '{"step": "charge", "attempt": 1}'::jsonb)$$,
    'a step.recorded event on the observability lane names the step and the attempt'
);
CREATE TEMP TABLE after_first AS SELECT pg_temp.steps_state('s1') AS state;
SELECT is(
    runrelay.record_step('s1', 1, tests.token('s1'), 'charge', '{"id": "ch_1"}'), 'recorded',
    'a repeat of the same call answers recorded again'
);
SELECT is(pg_temp.steps_state('s1'), (SELECT state FROM after_first), '... and writes nothing');
SELECT is(
    runrelay.record_step('s1', 1, tests.token('s1'), 'charge', '{"id": "ch_2"}'), 'already_recorded',
    'already_recorded: another result for a stored step'
);
SELECT is(pg_temp.steps_state('s1'), (SELECT state FROM after_first), '... the first result stands, nothing written');

-- Bad input: a clear error, nothing written.
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, tests.token('s1'), NULL, '{}')$$, '22023', NULL, 'step null'
);
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, tests.token('s1'), '', '{}')$$, '22023', NULL, 'step empty'
);
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, tests.token('s1'), repeat('x', 201), '{}')$$, '22023', NULL,
    'step over 200 characters'
);
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, tests.token('s1'), 'x', NULL)$$, '22023', NULL, 'result null'
);
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, tests.token('s1'), 'x', to_jsonb(repeat('x', 1100000)))$$, '54000', NULL,
    'a result over the payload cap'
);
SELECT throws_ok(
    $$SELECT runrelay.record_step('s1', 1, NULL, 'x', '{}')$$, '22023', NULL, 'lease_token null'
);
SELECT is(pg_temp.steps_state('s1'), (SELECT state FROM after_first), 'the refused calls wrote nothing');

-- A retry: the next attempt's claim returns the step; the stale attempt is fenced.
SELECT runrelay.record_step('s1', 1, tests.token('s1'), 'reserve', '[1, 2]');
SELECT is(
    runrelay.fail_attempt('s1', 1, tests.token('s1'), '{"e": 1}', retry_at => now() - interval '1 second'),
    'retry_scheduled', 'the first attempt fails and retries'
);
SELECT is(
    pg_temp.claimed_steps('s1'), '{"charge": {"id": "ch_1"}, "reserve": [1, 2]}'::jsonb,
    'the retried attempt''s claim returns every step'
);
SELECT is(
    runrelay.record_step('s1', 1, tests.token('s1', 1), 'ship', '{}'), 'fence_lost',
    'fence_lost: a stale attempt records nothing'
);
SELECT is(
    runrelay.record_step('s1', 1, tests.token('s1', 1), 'reserve', '[1, 2]'), 'recorded',
    '... but a repeat of its own recorded call still answers recorded'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.steps
        WHERE run_id = 's1' AND step = 'ship'
    ), 0::bigint,
    'the stale attempt''s step is not stored'
);

-- A wake: a sleep of the second attempt, then the third claim.
SELECT runrelay.record_step('s1', 2, tests.token('s1', 2), 'ship', '"shipped"');
SELECT is(
    runrelay.suspend_attempt(
        's1', 2, tests.token('s1', 2), jsonb_build_object('kind', 'sleep', 'until', now() + interval '1 minute')
    ), 'waiting', 'the second attempt sleeps'
);
SELECT tests.set_clock(interval '2 minutes');
SELECT is(
    pg_temp.claimed_steps('s1') ->> 'ship', 'shipped', 'the woken attempt''s claim returns the steps'
);
SELECT is(
    (
        SELECT resume FROM runrelay.runs
        WHERE run_id = 's1'
    ), '{"slept": true}'::jsonb, 'the woken run has its resume'
);
SELECT runrelay.record_step('s1', 3, tests.token('s1', 3), 'nap', '{"slept": true}');
SELECT is(
    (
        SELECT resume FROM runrelay.runs
        WHERE run_id = 's1'
    ), NULL,
    'the first step recorded after the wake takes the resume'
);

-- A release, then a reap: the steps stay.
SELECT is(runrelay.release_attempt('s1', 3, tests.token('s1', 3)), 'released', 'the third attempt is released');
SELECT is((SELECT count(*)::integer FROM jsonb_object_keys(pg_temp.claimed_steps('s1'))), 4, 'the claim after a release returns the steps');
SELECT tests.set_clock(interval '20 minutes');
SELECT ok((SELECT count(*) FROM runrelay.reap_expired()) >= 1, 'the fourth attempt is reaped');
SELECT tests.set_clock(interval '30 minutes');  -- past the retry's backoff
SELECT is((SELECT count(*)::integer FROM jsonb_object_keys(pg_temp.claimed_steps('s1'))), 4, 'the claim after a reap returns the steps');

-- cancelled: a pending cancellation wins over the write.
SELECT tests.mark_cancel('s1');
SELECT is(runrelay.record_step('s1', 5, tests.token('s1', 5), 'late', '{}'), 'cancelled', 'cancelled: nothing stored');

SELECT is(
    (
        SELECT count(*) FROM runrelay.steps
        WHERE run_id = 's1' AND step = 'late'
    ), 0::bigint,
    '... the cancelled attempt''s step is not stored'
);

-- A run without steps: its claim says null.
SELECT runrelay.enqueue_run(run_id => 's2', queue => 's2');
SELECT results_eq(
    $$SELECT c.run_id, c.steps IS NULL FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['s2']) AS c$$,
    $$VALUES ('s2', TRUE)$$,
    'a run without steps is claimed with steps null'
);
-- settings.step_events off: the step is stored, no event appended.
UPDATE runrelay.settings SET step_events = FALSE;
SELECT runrelay.record_step('s2', 1, tests.token('s2'), 'quiet', '{}');
SELECT results_eq(
    $$SELECT (SELECT count(*) FROM runrelay.steps WHERE run_id = 's2'),
             (SELECT count(*) FROM runrelay.ledger WHERE run_id = 's2' AND type = 'step.recorded')$$,
    $$VALUES (1::bigint, 0::bigint)$$,
    'with step_events off a step is stored without an event'
);
UPDATE runrelay.settings SET step_events = TRUE;
SELECT throws_ok(
    $$SELECT * FROM runrelay.append_events('s2', '[{"type": "step.recorded", "lane": "observability"}]')$$,
    '22023', NULL, 'a producer cannot append a step.recorded event'
);
SELECT results_eq(
    $$SELECT step, position, attempt FROM runrelay.run_steps('s1')$$,
    $$VALUES ('charge', 1, 1), ('reserve', 2, 1), ('ship', 3, 2), ('nap', 4, 3)$$,
    'run_steps: the steps in recorded order, with the attempts that recorded them'
);
SELECT results_eq(
    $$SELECT step FROM runrelay.run_steps('s1', after_position => 1, max_rows => 1)$$,
    $$VALUES ('reserve')$$,
    'run_steps pages by position'
);
DELETE FROM runrelay.runs
WHERE run_id = 's1';
SELECT is((
    SELECT count(*) FROM runrelay.steps
    WHERE run_id = 's1'
), 0::bigint, 'the steps go with the run');

SELECT * FROM finish();
ROLLBACK;
