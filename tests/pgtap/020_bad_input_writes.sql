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

-- A legal complete_attempts item for bi's running attempt, with p_fields on
-- top: the cases below break it one field at a time.
CREATE FUNCTION pg_temp.bi_item(p_fields jsonb DEFAULT '{}')
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object('run_id', 'bi', 'attempt', 1, 'lease_token', tests.token('bi')) || p_fields;
$$;

-- complete_attempts
SELECT throws_ok(format('SELECT * FROM runrelay.complete_attempts(%L)', c.items), c.errcode, NULL, c.description)
FROM (
    VALUES
    ('{}'::jsonb, '22023', 'complete_attempts: items not an array'),
    (NULL, '22023', 'complete_attempts: null items'),
    ('[1]', '22023', 'complete_attempts: an item not an object'),
    (jsonb_build_array(pg_temp.bi_item() - 'lease_token'), '22023', 'complete_attempts: an item without lease_token'),
    (jsonb_build_array(pg_temp.bi_item() - 'run_id'), '22023', 'complete_attempts: an item without run_id'),
    (jsonb_build_array(pg_temp.bi_item() - 'attempt'), '22023', 'complete_attempts: an item without attempt'),
    (jsonb_build_array(pg_temp.bi_item('{"attempt": "1"}')), '22023', 'complete_attempts: an attempt given as a string'),
    (jsonb_build_array(pg_temp.bi_item('{"attempt": 0}')), '22023', 'complete_attempts: attempt 0'),
    (jsonb_build_array(pg_temp.bi_item('{"attempt": -1}')), '22023', 'complete_attempts: a negative attempt'),
    (jsonb_build_array(pg_temp.bi_item('{"attempt": 1.5}')), '22023', 'complete_attempts: a fractional attempt'),
    (jsonb_build_array(pg_temp.bi_item('{"lease_token": "not-a-uuid"}')), '22023', 'complete_attempts: a lease_token that is not a uuid'),
    (jsonb_build_array(pg_temp.bi_item('{"run_id": ""}')), '22023', 'complete_attempts: an empty run_id'),
    (
        jsonb_build_array(pg_temp.bi_item(jsonb_build_object('run_id', repeat('x', 201)))),
        '22023', 'complete_attempts: a 201-character run_id'
    ),
    (jsonb_build_array(pg_temp.bi_item('{"result": null}')), '22023', 'complete_attempts: a null result'),
    (jsonb_build_array(pg_temp.bi_item('{"final_events": []}')), '22023', 'complete_attempts: an unknown item field'),
    (jsonb_build_array(pg_temp.bi_item(), pg_temp.bi_item()), '22023', 'complete_attempts: the same run twice in one batch'),
    (
        jsonb_build_array(pg_temp.bi_item(jsonb_build_object('result', (SELECT doc FROM big)))),
        '54000', 'complete_attempts: oversized items'
    ),
    (
        jsonb_build_array(pg_temp.bi_item(), pg_temp.bi_item('{"run_id": "zz", "attempt": "one"}')),
        '22023', 'complete_attempts: one malformed item rejects the whole batch'
    )
) AS c (items, errcode, description);

-- fail_attempt
SELECT throws_ok(format('SELECT runrelay.fail_attempt(%s)', c.args), c.errcode, NULL, c.description)
FROM (
    VALUES
    ($$'', 1, tests.token('bi'), '{}'$$, '22023', 'fail_attempt: empty run_id'),
    ($$repeat('x', 201), 1, tests.token('bi'), '{}'$$, '22023', 'fail_attempt: 201-character run_id'),
    ($$'bi', 0, tests.token('bi'), '{}'$$, '22023', 'fail_attempt: attempt 0'),
    ($$'bi', 1, NULL, '{}'$$, '22023', 'fail_attempt: null lease_token'),
    ($$'bi', 1, tests.token('bi'), NULL$$, '22023', 'fail_attempt: null error'),
    ($$'bi', 1, tests.token('bi'), (SELECT doc FROM big)$$, '54000', 'fail_attempt: oversized error'),
    ($$'bi', 1, tests.token('bi'), '{}', retry_at => 'infinity'$$, '22023', 'fail_attempt: infinite retry_at'),
    ($$'bi', 1, tests.token('bi'), '{}', final_events => '[{"type": 1}]'$$, '22023', 'fail_attempt: malformed final_events'),
    ($$'bi', 1, tests.token('bi'), '{}', preserve_runner_terminal => NULL$$, '22023', 'fail_attempt: null preserve_runner_terminal'),
    ($$'bi', 1, tests.token('bi'), '{}', protect_waiting_suspension => NULL$$, '22023', 'fail_attempt: null protect_waiting_suspension')
) AS c (args, errcode, description);

-- suspend_attempt
SELECT throws_ok(format('SELECT runrelay.suspend_attempt(%s)', c.args), c.errcode, NULL, c.description)
FROM (
    VALUES
    ($$'', 1, tests.token('bi'), '{"kind": "event", "name": "go"}'$$, '22023', 'suspend_attempt: empty run_id'),
    ($$'bi', 0, tests.token('bi'), '{"kind": "event", "name": "go"}'$$, '22023', 'suspend_attempt: attempt 0'),
    ($$'bi', 1, tests.token('bi'), '{"kind": "nap", "until": "2030-01-01T00:00:00Z"}'$$, '22023', 'suspend_attempt: an unknown wait kind'),
    ($$'bi', 1, tests.token('bi'), '{"name": "go"}'$$, '22023', 'suspend_attempt: a wait without kind'),
    ($$'bi', 1, tests.token('bi'), '["event"]'$$, '22023', 'suspend_attempt: a wait that is not an object'),
    ($$'bi', 1, tests.token('bi'), NULL$$, '22023', 'suspend_attempt: null wait'),
    ($$'bi', 1, tests.token('bi'), '{"kind": "sleep"}'$$, '22023', 'suspend_attempt: a sleep without until'),
    (
        $$'bi', 1, tests.token('bi'), '{"kind": "sleep", "until": "soon"}'$$,
        '22023', 'suspend_attempt: a sleep whose until is not a timestamp'
    ),
    ($$'bi', 1, tests.token('bi'), '{"kind": "sleep", "until": 1893456000}'$$, '22023', 'suspend_attempt: a sleep whose until is a number'),
    ($$'bi', 1, tests.token('bi'), '{"kind": "event"}'$$, '22023', 'suspend_attempt: an event wait without name'),
    ($$'bi', 1, tests.token('bi'), '{"kind": "event", "name": ""}'$$, '22023', 'suspend_attempt: an event wait with an empty name'),
    (
        $$'bi', 1, tests.token('bi'), jsonb_build_object('kind', 'event', 'name', repeat('n', 201))$$,
        '22023', 'suspend_attempt: an event wait with a 201-character name'
    ),
    ($$'bi', 1, tests.token('bi'), '{"kind": "detached_runner"}'$$, '22023', 'suspend_attempt: a detached_runner wait without runner'),
    (
        $$'bi', 1, tests.token('bi'), '{"kind": "event", "name": "go", "until": "2030-01-01"}'$$,
        '22023', 'suspend_attempt: a field that does not belong to the wait kind'
    ),
    (
        $$'bi', 1, tests.token('bi'), '{"kind": "event", "name": "go", "timeout_at": "infinity"}'$$,
        '22023', 'suspend_attempt: an infinite timeout_at'
    ),
    ($$'bi', 1, tests.token('bi'), '{"kind": "event", "name": "go"}', '[{}]'$$, '22023', 'suspend_attempt: malformed final_events'),
    (
        $$'bi', 1, tests.token('bi'), jsonb_build_object('kind', 'event', 'name', 'go') || (SELECT doc FROM big)$$,
        '54000', 'suspend_attempt: an oversized wait'
    )
) AS c (args, errcode, description);

-- prepare_waiting_failure, record_runner_terminal, claim_detached_terminal,
-- read_runner_terminal, reap_expired
SELECT throws_ok(c.call, c.errcode, NULL, c.description)
FROM (
    VALUES
    ($$SELECT runrelay.prepare_waiting_failure('', 1, tests.token('bi'))$$, '22023', 'prepare_waiting_failure: empty run_id'),
    ($$SELECT runrelay.prepare_waiting_failure('bi', 0, tests.token('bi'))$$, '22023', 'prepare_waiting_failure: attempt 0'),
    ($$SELECT runrelay.prepare_waiting_failure('bi', 1, NULL)$$, '22023', 'prepare_waiting_failure: null lease_token'),
    ($$SELECT runrelay.record_runner_terminal('', 1, '{}')$$, '22023', 'record_runner_terminal: empty run_id'),
    ($$SELECT runrelay.record_runner_terminal(repeat('x', 201), 1, '{}')$$, '22023', 'record_runner_terminal: 201-character run_id'),
    ($$SELECT runrelay.record_runner_terminal('bi', 0, '{}')$$, '22023', 'record_runner_terminal: attempt 0'),
    ($$SELECT runrelay.record_runner_terminal('bi', 1, NULL)$$, '22023', 'record_runner_terminal: null result'),
    ($$SELECT runrelay.record_runner_terminal('bi', 1, (SELECT doc FROM big))$$, '54000', 'record_runner_terminal: oversized result'),
    ($$SELECT runrelay.claim_detached_terminal('', 1, tests.token('bi'))$$, '22023', 'claim_detached_terminal: empty run_id'),
    ($$SELECT runrelay.claim_detached_terminal('bi', 0, tests.token('bi'))$$, '22023', 'claim_detached_terminal: attempt 0'),
    ($$SELECT runrelay.claim_detached_terminal('bi', 1, NULL)$$, '22023', 'claim_detached_terminal: null lease_token'),
    ($$SELECT * FROM runrelay.read_runner_terminal('', 1)$$, '22023', 'read_runner_terminal: empty run_id'),
    ($$SELECT * FROM runrelay.read_runner_terminal(repeat('x', 201), 1)$$, '22023', 'read_runner_terminal: 201-character run_id'),
    ($$SELECT * FROM runrelay.read_runner_terminal('bi', 0)$$, '22023', 'read_runner_terminal: attempt 0'),
    ($$SELECT * FROM runrelay.reap_expired(0)$$, '22023', 'reap_expired: max_attempts 0'),
    ($$SELECT * FROM runrelay.reap_expired(-1)$$, '22023', 'reap_expired: negative max_attempts')
) AS c (call, errcode, description);

-- Nothing was changed by any call that raised.
SELECT * FROM tests.still_running('bi');

SELECT * FROM finish();
ROLLBACK;
