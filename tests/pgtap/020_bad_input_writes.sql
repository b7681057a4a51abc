-- Bad input to complete_attempts, fail_attempt, suspend_attempt (unknown
-- wait kinds, malformed waits), the detached-runner functions and
-- reap_expired (SPEC §5, §6): 22023, or 54000 for payloads over
-- settings.max_payload_bytes (lowered to 1024 here); and nothing changed by a
-- call that raises.
BEGIN;
SELECT plan(63);

UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT tests.start_run('bi');
CREATE TEMP TABLE big AS SELECT jsonb_build_object('pad', repeat('x', 2000)) AS doc;

-- complete_attempts
SELECT throws_ok($$SELECT * FROM runrelay.complete_attempts('{}')$$, '22023', NULL, 'complete_attempts: items not an array');
SELECT throws_ok($$SELECT * FROM runrelay.complete_attempts(NULL)$$, '22023', NULL, 'complete_attempts: null items');
SELECT throws_ok($$SELECT * FROM runrelay.complete_attempts('[1]')$$, '22023', NULL, 'complete_attempts: an item not an object');
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(jsonb_build_object('run_id', 'bi', 'attempt', 1)))$$,
    '22023', NULL, 'complete_attempts: an item without lease_token'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('attempt', 1, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: an item without run_id'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: an item without attempt'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', '1', 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: an attempt given as a string'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 0, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: attempt 0'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', -1, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: a negative attempt'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1.5, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: a fractional attempt'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', 'not-a-uuid')))$$,
    '22023', NULL, 'complete_attempts: a lease_token that is not a uuid'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', '', 'attempt', 1, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: an empty run_id'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', repeat('x', 201), 'attempt', 1, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: a 201-character run_id'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi'), 'result', NULL)))$$,
    '22023', NULL, 'complete_attempts: a null result'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi'), 'final_events', '[]'::jsonb)))$$,
    '22023', NULL, 'complete_attempts: an unknown item field'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi')),
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: the same run twice in one batch'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi'), 'result', (SELECT doc FROM big))))$$,
    '54000', NULL, 'complete_attempts: oversized items'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(
        jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi')),
        jsonb_build_object('run_id', 'zz', 'attempt', 'one', 'lease_token', tests.token('bi'))))$$,
    '22023', NULL, 'complete_attempts: one malformed item rejects the whole batch'
);

-- fail_attempt
SELECT throws_ok($$SELECT runrelay.fail_attempt('', 1, tests.token('bi'), '{}')$$, '22023', NULL, 'fail_attempt: empty run_id');
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt(repeat('x', 201), 1, tests.token('bi'), '{}')$$, '22023', NULL,
    'fail_attempt: 201-character run_id'
);
SELECT throws_ok($$SELECT runrelay.fail_attempt('bi', 0, tests.token('bi'), '{}')$$, '22023', NULL, 'fail_attempt: attempt 0');
SELECT throws_ok($$SELECT runrelay.fail_attempt('bi', 1, NULL, '{}')$$, '22023', NULL, 'fail_attempt: null lease_token');
SELECT throws_ok($$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), NULL)$$, '22023', NULL, 'fail_attempt: null error');
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), (SELECT doc FROM big))$$, '54000', NULL,
    'fail_attempt: oversized error'
);
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), '{}', retry_at => 'infinity')$$, '22023', NULL,
    'fail_attempt: infinite retry_at'
);
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), '{}', final_events => '[{"type": 1}]')$$, '22023', NULL,
    'fail_attempt: malformed final_events'
);
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), '{}', preserve_runner_terminal => NULL)$$, '22023', NULL,
    'fail_attempt: null preserve_runner_terminal'
);
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('bi', 1, tests.token('bi'), '{}', protect_waiting_suspension => NULL)$$, '22023', NULL,
    'fail_attempt: null protect_waiting_suspension'
);

-- suspend_attempt
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('', 1, tests.token('bi'), '{"kind": "event", "name": "go"}')$$, '22023', NULL,
    'suspend_attempt: empty run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 0, tests.token('bi'), '{"kind": "event", "name": "go"}')$$, '22023', NULL,
    'suspend_attempt: attempt 0'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "nap", "until": "2030-01-01T00:00:00Z"}')$$,
    '22023', NULL, 'suspend_attempt: an unknown wait kind'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"name": "go"}')$$, '22023', NULL,
    'suspend_attempt: a wait without kind'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '["event"]')$$, '22023', NULL,
    'suspend_attempt: a wait that is not an object'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), NULL)$$, '22023', NULL, 'suspend_attempt: null wait'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "sleep"}')$$, '22023', NULL,
    'suspend_attempt: a sleep without until'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "sleep", "until": "soon"}')$$, '22023', NULL,
    'suspend_attempt: a sleep whose until is not a timestamp'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "sleep", "until": 1893456000}')$$, '22023', NULL,
    'suspend_attempt: a sleep whose until is a number'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "event"}')$$, '22023', NULL,
    'suspend_attempt: an event wait without name'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "event", "name": ""}')$$, '22023', NULL,
    'suspend_attempt: an event wait with an empty name'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), jsonb_build_object('kind', 'event', 'name', repeat('n', 201)))$$,
    '22023', NULL, 'suspend_attempt: an event wait with a 201-character name'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "detached_runner"}')$$, '22023', NULL,
    'suspend_attempt: a detached_runner wait without runner'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "event", "name": "go", "until": "2030-01-01"}')$$,
    '22023', NULL, 'suspend_attempt: a field that does not belong to the wait kind'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "event", "name": "go", "timeout_at": "infinity"}')$$,
    '22023', NULL, 'suspend_attempt: an infinite timeout_at'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('bi', 1, tests.token('bi'), '{"kind": "event", "name": "go"}', '[{}]')$$, '22023', NULL,
    'suspend_attempt: malformed final_events'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt(
        'bi', 1, tests.token('bi'), jsonb_build_object('kind', 'event', 'name', 'go') || (SELECT doc FROM big)
    )$$,
    '54000', NULL, 'suspend_attempt: an oversized wait'
);

-- prepare_waiting_failure, record_runner_terminal, claim_detached_terminal, read_runner_terminal
SELECT throws_ok(
    $$SELECT runrelay.prepare_waiting_failure('', 1, tests.token('bi'))$$, '22023', NULL, 'prepare_waiting_failure: empty run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.prepare_waiting_failure('bi', 0, tests.token('bi'))$$, '22023', NULL, 'prepare_waiting_failure: attempt 0'
);
SELECT throws_ok(
    $$SELECT runrelay.prepare_waiting_failure('bi', 1, NULL)$$, '22023', NULL, 'prepare_waiting_failure: null lease_token'
);
SELECT throws_ok($$SELECT runrelay.record_runner_terminal('', 1, '{}')$$, '22023', NULL, 'record_runner_terminal: empty run_id');
SELECT throws_ok(
    $$SELECT runrelay.record_runner_terminal(repeat('x', 201), 1, '{}')$$, '22023', NULL,
    'record_runner_terminal: 201-character run_id'
);
SELECT throws_ok($$SELECT runrelay.record_runner_terminal('bi', 0, '{}')$$, '22023', NULL, 'record_runner_terminal: attempt 0');
SELECT throws_ok($$SELECT runrelay.record_runner_terminal('bi', 1, NULL)$$, '22023', NULL, 'record_runner_terminal: null result');
SELECT throws_ok(
    $$SELECT runrelay.record_runner_terminal('bi', 1, (SELECT doc FROM big))$$, '54000', NULL,
    'record_runner_terminal: oversized result'
);
SELECT throws_ok(
    $$SELECT runrelay.claim_detached_terminal('', 1, tests.token('bi'))$$, '22023', NULL, 'claim_detached_terminal: empty run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.claim_detached_terminal('bi', 0, tests.token('bi'))$$, '22023', NULL, 'claim_detached_terminal: attempt 0'
);
SELECT throws_ok(
    $$SELECT runrelay.claim_detached_terminal('bi', 1, NULL)$$, '22023', NULL, 'claim_detached_terminal: null lease_token'
);
SELECT throws_ok($$SELECT * FROM runrelay.read_runner_terminal('', 1)$$, '22023', NULL, 'read_runner_terminal: empty run_id');
SELECT throws_ok(
    $$SELECT * FROM runrelay.read_runner_terminal(repeat('x', 201), 1)$$, '22023', NULL,
    'read_runner_terminal: 201-character run_id'
);
SELECT throws_ok($$SELECT * FROM runrelay.read_runner_terminal('bi', 0)$$, '22023', NULL, 'read_runner_terminal: attempt 0');

-- reap_expired
SELECT throws_ok($$SELECT * FROM runrelay.reap_expired(0)$$, '22023', NULL, 'reap_expired: max_attempts 0');
SELECT throws_ok($$SELECT * FROM runrelay.reap_expired(-1)$$, '22023', NULL, 'reap_expired: negative max_attempts');

-- Nothing was changed by any call that raised.
SELECT results_eq(
    $$SELECT r.status, r.result, r.error, r.wait, a.status, a.runner_result, a.error
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = 'bi'$$,
    $$VALUES ('running', NULL::jsonb, NULL::jsonb, NULL::jsonb, 'running', NULL::jsonb, NULL::jsonb)$$,
    'the run every rejected write targeted is still running, untouched'
);
SELECT is(tests.lifecycle('bi'), ARRAY['run.queued', 'run.started'], 'no rejected call emitted an event');

SELECT * FROM finish();
ROLLBACK;
