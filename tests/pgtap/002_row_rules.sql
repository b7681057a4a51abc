-- The row rules of runs, attempts, ledger_events and ledger_lanes (the
-- runs_rules, attempts_rules, ledger_events_rules and ledger_lanes_rules CHECK
-- constraints, which call _runs_rules, _attempts_rules, _ledger_events_rules
-- and _ledger_lanes_rules): each rule
-- rejects a row that breaks it with SQLSTATE 23514 and the message a CHECK
-- constraint of the rule's name gives, so the error still says which rule.
-- Each statement below breaks exactly one rule of a legal row, unless it says
-- two: then the first broken rule by name is reported, as PostgreSQL orders
-- separate CHECK constraints.
BEGIN;
SELECT plan(65);

SELECT tests.insert_run('rr');
SELECT tests.insert_run('ra');
INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at, lease_expires_at)
VALUES ('ra', 1, 'w', gen_random_uuid(), 'running', now(), now() + interval '1 minute');

-- p_statement is refused with the error a CHECK constraint named p_rule on
-- p_relation gives.
CREATE FUNCTION pg_temp.breaks(p_statement text, p_relation text, p_rule text, p_description text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT throws_ok(
        p_statement, '23514',
        format('new row for relation "%s" violates check constraint "%s"', p_relation, p_rule),
        p_description
    );
$$;

-- The same for p_change, a SET list, made to the legal p_relation row of run
-- p_run_id.
CREATE FUNCTION pg_temp.change_breaks(p_relation text, p_run_id text, p_change text, p_rule text, p_description text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT pg_temp.breaks(
        format('UPDATE runrelay.%I SET %s WHERE run_id = %L', p_relation, p_change, p_run_id),
        p_relation, p_rule, p_description
    );
$$;

SELECT pg_temp.change_breaks('runs', 'rr', c.change, c.rule, c.description)
FROM (
    VALUES
    ($$run_id = ''$$, 'runs_run_id_length', 'runs: an empty run_id breaks runs_run_id_length'),
    ($$run_id = repeat('x', 201)$$, 'runs_run_id_length', 'runs: a run_id over 200 characters breaks runs_run_id_length'),
    ($$queue = ''$$, 'runs_queue_length', 'runs: an empty queue breaks runs_queue_length'),
    ($$status = 'done'$$, 'runs_status', 'runs: an unknown status breaks runs_status'),
    ($$status = 'failed'$$, 'runs_finished_iff_terminal', 'runs: a terminal run without finished_at breaks runs_finished_iff_terminal'),
    ($$finished_at = now()$$, 'runs_finished_iff_terminal', 'runs: a live run with finished_at breaks runs_finished_iff_terminal'),
    ($$status = 'waiting', attempt_count = 1$$, 'runs_wait_iff_waiting', 'runs: a waiting run without a wait breaks runs_wait_iff_waiting'),
    ($$wait = '{}'$$, 'runs_wait_iff_waiting', 'runs: a queued run with a wait breaks runs_wait_iff_waiting'),
    ($$wake_at = now()$$, 'runs_wake_at_only_waiting', 'runs: a queued run with wake_at breaks runs_wake_at_only_waiting'),
    ($$payload_retention = 'forever'$$, 'runs_payload_retention', 'runs: an unknown payload_retention breaks runs_payload_retention'),
    ($$max_attempts = 0$$, 'runs_max_attempts', 'runs: max_attempts 0 breaks runs_max_attempts'),
    ($$max_attempts = 1001$$, 'runs_max_attempts', 'runs: max_attempts 1001 breaks runs_max_attempts'),
    ($$attempt_count = -1$$, 'runs_attempt_count', 'runs: a negative attempt_count breaks runs_attempt_count'),
    ($$series_start = 1$$, 'runs_series_start', 'runs: an attempt series after the last attempt breaks runs_series_start'),
    ($$series_start = -1$$, 'runs_series_start', 'runs: a negative series_start breaks runs_series_start'),
    ($$status = 'running'$$, 'runs_started_has_attempt', 'runs: a running run without an attempt breaks runs_started_has_attempt'),
    ($$concurrency_key = 'k'$$, 'runs_key_position_iff_key', 'runs: a concurrency key without a position breaks runs_key_position_iff_key'),
    ($$key_held = TRUE$$, 'runs_key_held_only_queued', 'runs: key_held without a concurrency key breaks runs_key_held_only_queued'),
    (
        $$status = 'completed', finished_at = now()$$, 'runs_completed_has_result',
        'runs: a completed run without a result breaks runs_completed_has_result'
    ),
    ($$ledger_seq = -1$$, 'runs_ledger_seq', 'runs: a negative ledger_seq breaks runs_ledger_seq')
) AS c (change, rule, description);
SELECT pg_temp.breaks(
    $$ SELECT tests.insert_run('bad-insert', 'exploded') $$,
    'runs', 'runs_status', 'runs: an INSERT with an unknown status breaks runs_status'
);
SELECT pg_temp.change_breaks(
    'runs', 'rr', $$status = 'done', attempt_count = -1$$, 'runs_attempt_count',
    'runs: two broken rules: the first by name breaks runs_attempt_count'
);
SELECT pg_temp.change_breaks('attempts', 'ra', c.change, c.rule, c.description)
FROM (
    VALUES
    ($$attempt = 0$$, 'attempts_attempt', 'attempts: attempt 0 breaks attempts_attempt'),
    ($$status = 'exploded'$$, 'attempts_status', 'attempts: an unknown status breaks attempts_status'),
    (
        $$lease_expires_at = NULL$$, 'attempts_running_has_lease',
        'attempts: a running attempt without a lease breaks attempts_running_has_lease'
    ),
    (
        $$status = 'completed'$$, 'attempts_finished_iff_ended',
        'attempts: an ended attempt without finished_at breaks attempts_finished_iff_ended'
    ),
    (
        $$finished_at = now()$$, 'attempts_finished_iff_ended',
        'attempts: a running attempt with finished_at breaks attempts_finished_iff_ended'
    ),
    ($$status = 'waiting'$$, 'attempts_waiting_has_wait', 'attempts: a waiting attempt without a wait breaks attempts_waiting_has_wait'),
    (
        $$runner_result_received_at = now()$$, 'attempts_received_has_result',
        'attempts: a received result that is missing breaks attempts_received_has_result'
    ),
    ($$outcome = 'fence_lost', outcome_op = 'complete'$$, 'attempts_outcome', 'attempts: an unknown outcome breaks attempts_outcome'),
    ($$outcome = 'completed'$$, 'attempts_outcome_op', 'attempts: an outcome without its operation breaks attempts_outcome_op')
) AS c (change, rule, description);
SELECT pg_temp.breaks(
    $$ INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at)
       VALUES ('ra', 2, 'w', gen_random_uuid(), 'running', now()) $$,
    'attempts', 'attempts_running_has_lease',
    'attempts: an INSERT of a running attempt without a lease breaks attempts_running_has_lease'
);
SELECT pg_temp.change_breaks(
    'attempts', 'ra', $$status = 'nope', outcome = 'nope', outcome_op = 'x'$$, 'attempts_outcome',
    'attempts: two broken rules: the first by name breaks attempts_outcome'
);
SELECT lives_ok(
    $$ UPDATE runrelay.runs SET status = 'completed', finished_at = now(), result = '{}' WHERE run_id = 'rr' $$,
    'a completed run with its result and finished_at is accepted'
);
SELECT lives_ok(
    $$ UPDATE runrelay.attempts
       SET status = 'completed', finished_at = now(), lease_expires_at = NULL,
           outcome = 'completed', outcome_op = 'complete'
       WHERE run_id = 'ra' $$,
    'a completed attempt with its outcome is accepted'
);

-- ledger_events: one legal pending event, then each rule broken once.
INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key, created_at, next_attempt_at)
VALUES ('rr', 'lifecycle', 1, 'run.queued', '{}', 'rr:1', now(), now());
SELECT pg_temp.change_breaks('ledger_events', 'rr', c.change, c.rule, c.description)
FROM (
    VALUES
    (
        $$acked_locally = TRUE$$, 'ledger_acked_locally_delivered',
        'ledger_events: acknowledged locally but not delivered breaks ledger_acked_locally_delivered'
    ),
    (
        $$batch_id = gen_random_uuid(), batch_started_at = now()$$, 'ledger_batch_delivered',
        'ledger_events: a delivery batch on an undelivered event breaks ledger_batch_delivered'
    ),
    (
        $$batch_id = gen_random_uuid(), delivered_at = now(), delivered_by = 'r'$$, 'ledger_batch_started',
        'ledger_events: a batch without its start breaks ledger_batch_started'
    ),
    ($$delivered_at = now()$$, 'ledger_delivered_by', 'ledger_events: delivered by nobody breaks ledger_delivered_by'),
    (
        $$delivered_at = now(), delivered_by = 'r', failed_at = now()$$, 'ledger_delivered_not_failed',
        'ledger_events: delivered and failed breaks ledger_delivered_not_failed'
    ),
    ($$delivery_attempts = -1$$, 'ledger_delivery_attempts', 'ledger_events: negative delivery attempts break ledger_delivery_attempts'),
    ($$delivery_key = ''$$, 'ledger_delivery_key_length', 'ledger_events: an empty delivery key breaks ledger_delivery_key_length'),
    ($$lane = 'audit'$$, 'ledger_lane', 'ledger_events: an unknown lane breaks ledger_lane'),
    (
        $$local_ack_call_id = gen_random_uuid()$$, 'ledger_local_ack_call',
        'ledger_events: a local-ack call on an event not acknowledged locally breaks ledger_local_ack_call'
    ),
    ($$seq = 0$$, 'ledger_seq_positive', 'ledger_events: seq 0 breaks ledger_seq_positive'),
    ($$type = repeat('t', 201)$$, 'ledger_type_length', 'ledger_events: a type over 200 characters breaks ledger_type_length'),
    ($$lane = 'audit', type = ''$$, 'ledger_lane', 'ledger_events: two rules broken report the first by name')
) AS c (change, rule, description);
SELECT lives_ok(
    $$ UPDATE runrelay.ledger_events
       SET delivered_at = now(), delivered_by = 'r', batch_id = gen_random_uuid(), batch_started_at = now(),
           acked_locally = TRUE, local_ack_call_id = gen_random_uuid(), delivery_attempts = 1
       WHERE run_id = 'rr' $$,
    'a delivered event with its batch and local acknowledgement is accepted'
);

-- A lane with a claimable head: every rule of ledger_lanes holds.
INSERT INTO runrelay.ledger_lanes (run_id, lane, head_seq, available_at) VALUES ('rr', 'lifecycle', 1, now());
SELECT pg_temp.change_breaks('ledger_lanes', 'rr', c.change, c.rule, c.description)
FROM (
    VALUES
    (
        $$head_seq = NULL$$, 'ledger_lanes_available_has_head',
        'ledger_lanes: an available lane without a head breaks ledger_lanes_available_has_head'
    ),
    (
        $$batch_id = gen_random_uuid()$$, 'ledger_lanes_batch',
        'ledger_lanes: a batch without its start and last seq breaks ledger_lanes_batch'
    ),
    (
        $$blocked = TRUE$$, 'ledger_lanes_blocked_not_available',
        'ledger_lanes: a blocked lane that is available breaks ledger_lanes_blocked_not_available'
    ),
    ($$lane = 'audit'$$, 'ledger_lanes_lane', 'ledger_lanes: an unknown lane breaks ledger_lanes_lane'),
    ($$lease_owner = 'r'$$, 'ledger_lanes_lease', 'ledger_lanes: a lease owner without its expiry and extent breaks ledger_lanes_lease'),
    ($$lane = 'audit', lease_owner = 'r'$$, 'ledger_lanes_lane', 'ledger_lanes: two rules broken report the first by name')
) AS c (change, rule, description);
SELECT lives_ok(
    $$ UPDATE runrelay.ledger_lanes
       SET lease_owner = 'r', lease_expires_at = now() + interval '1 minute', leased_through = 1,
           lease_call_id = gen_random_uuid(), batch_id = gen_random_uuid(), batch_started_at = now(),
           batch_through = 1
       WHERE run_id = 'rr' $$,
    'a leased lane with its frozen batch is accepted'
);

SELECT volatility_is(
    'runrelay', '_runs_rules',
    ARRAY[
        'text', 'text', 'text', 'timestamp with time zone', 'jsonb', 'timestamp with time zone',
        'text', 'integer', 'integer', 'text', 'bigint', 'boolean', 'jsonb', 'bigint', 'integer'
    ],
    'immutable', '_runs_rules is IMMUTABLE'
);
SELECT volatility_is(
    'runrelay', '_attempts_rules',
    ARRAY[
        'integer', 'text', 'timestamp with time zone', 'timestamp with time zone', 'jsonb',
        'timestamp with time zone', 'jsonb', 'text', 'text'
    ],
    'immutable', '_attempts_rules is IMMUTABLE'
);
SELECT volatility_is(
    'runrelay', '_ledger_events_rules',
    ARRAY[
        'text', 'text', 'text', 'bigint', 'timestamp with time zone', 'text', 'timestamp with time zone',
        'uuid', 'timestamp with time zone', 'integer', 'boolean', 'uuid'
    ],
    'immutable', '_ledger_events_rules is IMMUTABLE'
);
SELECT volatility_is(
    'runrelay', '_ledger_lanes_rules',
    ARRAY[
        'text', 'bigint', 'timestamp with time zone', 'boolean', 'text', 'timestamp with time zone',
        'bigint', 'uuid', 'uuid', 'timestamp with time zone', 'bigint'
    ],
    'immutable', '_ledger_lanes_rules is IMMUTABLE'
);
SELECT
    ok(
        NOT has_function_privilege('public', p.oid, 'EXECUTE'),
        p.proname || ' is not executable by PUBLIC'
    )
FROM pg_catalog.pg_proc AS p
WHERE
    p.pronamespace = 'runrelay'::regnamespace AND p.proname IN (
        '_runs_rules', '_attempts_rules', '_ledger_events_rules', '_ledger_lanes_rules'
    )
ORDER BY p.proname;
SELECT is(
    (
        SELECT array_agg(c.conname::text ORDER BY c.conname)
        FROM pg_catalog.pg_constraint AS c
        WHERE
            c.conrelid IN ('runrelay.runs'::regclass, 'runrelay.attempts'::regclass, 'runrelay.ledger_events'::regclass)
            AND c.contype = 'c'
    ),
    ARRAY['attempts_rules', 'ledger_events_rules', 'runs_rules'],
    'runs, attempts and ledger_events each have one CHECK, which calls their rules function'
);
SELECT is(
    (
        SELECT array_agg(c.conname::text ORDER BY c.conname)
        FROM pg_catalog.pg_constraint AS c
        WHERE c.conrelid = 'runrelay.ledger_lanes'::regclass AND c.contype = 'c'
    ),
    ARRAY['ledger_lanes_rules'],
    'ledger_lanes has one CHECK, which calls its rules function'
);

SELECT * FROM finish();
ROLLBACK;
