-- Bad input to the producer functions, claims, heartbeats and
-- complete_attempt (SPEC §5, §6): 22023 for invalid identifiers, integers,
-- times and JSON shapes; 54000 for payloads over settings.max_payload_bytes
-- (lowered to 1024 here); lease_seconds clamped, never rejected; and nothing
-- changed by a call that raises. 020 covers the other worker functions.
BEGIN;
SELECT plan(70);

UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT tests.start_run('bi');
CREATE TEMP TABLE big AS SELECT jsonb_build_object('pad', repeat('x', 2000)) AS doc;

-- enqueue_run
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => '')$$, '22023', NULL, 'enqueue_run: empty run_id');
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => '   ')$$, '22023', NULL, 'enqueue_run: blank run_id');
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => repeat('x', 201))$$, '22023', NULL, 'enqueue_run: 201-character run_id'
);
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => NULL)$$, '22023', NULL, 'enqueue_run: null run_id');
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => repeat('y', 200), queue => repeat('q', 200))$$,
    'enqueue_run: 200-character run_id and queue are accepted'
);
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => 'b1', queue => '')$$, '22023', NULL, 'enqueue_run: empty queue');
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', queue => repeat('q', 201))$$, '22023', NULL,
    'enqueue_run: 201-character queue'
);
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => 'b1', queue => NULL)$$, '22023', NULL, 'enqueue_run: null queue');
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', max_attempts => -1)$$, '22023', NULL, 'enqueue_run: negative max_attempts'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', max_attempts => 0)$$, '22023', NULL, 'enqueue_run: max_attempts 0'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', max_attempts => NULL)$$, '22023', NULL, 'enqueue_run: null max_attempts'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', max_attempts => 1001)$$, '22023', NULL, 'enqueue_run: max_attempts 1001'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', priority => 1000001)$$, '22023', NULL, 'enqueue_run: priority 1000001'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', priority => -1000001)$$, '22023', NULL, 'enqueue_run: priority -1000001'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', concurrency_key => E'\t\n')$$, '22023', NULL,
    'enqueue_run: a whitespace concurrency_key'
);
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b-edge1', priority => 1000000, max_attempts => 1000)$$,
    'enqueue_run: priority 1000000 and max_attempts 1000 are accepted'
);
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b-edge2', priority => -1000000, concurrency_key => repeat('k', 200))$$,
    'enqueue_run: priority -1000000 and a 200-character concurrency_key are accepted'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', payload_retention => 'forever')$$, '22023', NULL,
    'enqueue_run: unknown payload_retention'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', run_at => 'infinity')$$, '22023', NULL, 'enqueue_run: infinite run_at'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', concurrency_key => '')$$, '22023', NULL, 'enqueue_run: empty concurrency_key'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', concurrency_key => repeat('k', 201))$$, '22023', NULL,
    'enqueue_run: 201-character concurrency_key'
);
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => 'b1', payload => NULL)$$, '22023', NULL, 'enqueue_run: null payload');
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b1', payload => (SELECT doc FROM big))$$, '54000', NULL,
    'enqueue_run: a payload over max_payload_bytes raises 54000'
);
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b-fits', payload => jsonb_build_object('pad', repeat('x', 900)))$$,
    'enqueue_run: a payload under max_payload_bytes is accepted'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs
        WHERE run_id = 'b1'
    ), 0::bigint, 'no rejected enqueue created a run'
);

-- signal_run
SELECT throws_ok($$SELECT runrelay.signal_run('', 'go')$$, '22023', NULL, 'signal_run: empty run_id');
SELECT throws_ok($$SELECT runrelay.signal_run(repeat('x', 201), 'go')$$, '22023', NULL, 'signal_run: 201-character run_id');
SELECT throws_ok($$SELECT runrelay.signal_run('bi', '')$$, '22023', NULL, 'signal_run: empty name');
SELECT throws_ok($$SELECT runrelay.signal_run('bi', repeat('n', 201))$$, '22023', NULL, 'signal_run: 201-character name');
SELECT throws_ok($$SELECT runrelay.signal_run('bi', NULL)$$, '22023', NULL, 'signal_run: null name');
SELECT throws_ok($$SELECT runrelay.signal_run('bi', 'go', NULL)$$, '22023', NULL, 'signal_run: null payload');
SELECT throws_ok(
    $$SELECT runrelay.signal_run('bi', 'go', (SELECT doc FROM big))$$, '54000', NULL, 'signal_run: oversized payload'
);
SELECT is((SELECT count(*) FROM runrelay.signals), 0::bigint, 'no rejected signal was stored');

-- cancel_run
SELECT throws_ok($$SELECT runrelay.cancel_run('')$$, '22023', NULL, 'cancel_run: empty run_id');
SELECT throws_ok($$SELECT runrelay.cancel_run(repeat('x', 201))$$, '22023', NULL, 'cancel_run: 201-character run_id');
SELECT throws_ok($$SELECT runrelay.cancel_run(NULL)$$, '22023', NULL, 'cancel_run: null run_id');
SELECT throws_ok(
    $$SELECT runrelay.cancel_run('bi', repeat('r', 2001))$$, '22023', NULL, 'cancel_run: a reason over 2000 characters'
);
SELECT is((SELECT count(*) FROM runrelay.cancellations), 0::bigint, 'no rejected cancel wrote a marker');

-- claim_attempts
SELECT throws_ok($$SELECT * FROM runrelay.claim_attempts(worker => '')$$, '22023', NULL, 'claim_attempts: empty worker');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => repeat('w', 201))$$, '22023', NULL,
    'claim_attempts: 201-character worker'
);
SELECT throws_ok($$SELECT * FROM runrelay.claim_attempts(worker => NULL)$$, '22023', NULL, 'claim_attempts: null worker');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', max_runs => 0)$$, '22023', NULL, 'claim_attempts: max_runs 0'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', max_runs => -1)$$, '22023', NULL,
    'claim_attempts: negative max_runs'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => '{}')$$, '22023', NULL,
    'claim_attempts: an empty queues array'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY['ok', ''])$$, '22023', NULL,
    'claim_attempts: an empty queue name'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY[repeat('q', 201)])$$, '22023', NULL,
    'claim_attempts: a 201-character queue name'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY['q-none'], lease_seconds => -100)$$,
    'claim_attempts: an out-of-range lease_seconds is clamped, not rejected'
);

-- heartbeat
SELECT throws_ok($$SELECT * FROM runrelay.heartbeat('', 1, tests.token('bi'))$$, '22023', NULL, 'heartbeat: empty run_id');
SELECT throws_ok(
    $$SELECT * FROM runrelay.heartbeat(repeat('x', 201), 1, tests.token('bi'))$$, '22023', NULL,
    'heartbeat: 201-character run_id'
);
SELECT throws_ok($$SELECT * FROM runrelay.heartbeat('bi', 0, tests.token('bi'))$$, '22023', NULL, 'heartbeat: attempt 0');
SELECT throws_ok($$SELECT * FROM runrelay.heartbeat('bi', NULL, tests.token('bi'))$$, '22023', NULL, 'heartbeat: null attempt');
SELECT throws_ok($$SELECT * FROM runrelay.heartbeat('bi', 1, NULL)$$, '22023', NULL, 'heartbeat: null lease_token');
SELECT lives_ok(
    $$SELECT * FROM runrelay.heartbeat('bi', 1, tests.token('bi'), 100000)$$,
    'heartbeat: an out-of-range lease_seconds is clamped, not rejected'
);

-- complete_attempt
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('', 1, tests.token('bi'))$$, '22023', NULL, 'complete_attempt: empty run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt(repeat('x', 201), 1, tests.token('bi'))$$, '22023', NULL,
    'complete_attempt: 201-character run_id'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', -1, tests.token('bi'))$$, '22023', NULL, 'complete_attempt: negative attempt'
);
SELECT throws_ok($$SELECT runrelay.complete_attempt('bi', 1, NULL)$$, '22023', NULL, 'complete_attempt: null lease_token');
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), NULL)$$, '22023', NULL, 'complete_attempt: null result'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), (SELECT doc FROM big))$$, '54000', NULL,
    'complete_attempt: oversized result'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '{"type": "x"}')$$, '22023', NULL,
    'complete_attempt: final_events that is not an array'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[1]')$$, '22023', NULL,
    'complete_attempt: a final event that is not an object'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[{"payload": {}}]')$$, '22023', NULL,
    'complete_attempt: a final event without a type'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[{"type": ""}]')$$, '22023', NULL,
    'complete_attempt: a final event with an empty type'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[{"type": "x", "lane": "audit"}]')$$,
    '22023', NULL, 'complete_attempt: a final event on an unknown lane'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[{"type": "x", "colour": "red"}]')$$,
    '22023', NULL, 'complete_attempt: a final event with an unknown field'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', '[{"type": "x", "transport_only": "yes"}]')$$,
    '22023', NULL, 'complete_attempt: a final event whose transport_only is not a boolean'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('bi', 1, tests.token('bi'), '{}', NULL)$$, '22023', NULL,
    'complete_attempt: null final_events'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt(
        'bi', 1, tests.token('bi'), '{}', jsonb_build_array(jsonb_build_object('type', 'x', 'payload', (SELECT doc FROM big)))
    )$$,
    '54000', NULL, 'complete_attempt: oversized final_events'
);

-- Nothing was changed by any call that raised.
SELECT * FROM tests.still_running('bi');

SELECT * FROM finish();
ROLLBACK;
