-- append_events (SPEC §3.1): per-run seq strictly increasing across calls and
-- lanes, default and explicit delivery keys, defaults of an event, appends to
-- ended runs, and every kind of bad input (22023) or oversized input (54000).
BEGIN;
SELECT plan(38);

SELECT runrelay.enqueue_run('r1');
SELECT results_eq(
    $$SELECT seq, delivery_key FROM runrelay.append_events('r1', '[{"type": "a"}, {"type": "b"}, {"type": "c"}]')$$,
    $$VALUES (2::bigint, 'r1:2'), (3::bigint, 'r1:3'), (4::bigint, 'r1:4')$$,
    'events follow run.queued (seq 1) in array order, with default keys <run_id>:<seq>'
);
SELECT is(
    (
        SELECT array_agg(l.event_id ORDER BY l.seq) = array_agg(l.event_id ORDER BY l.event_id) FROM runrelay.ledger AS l
        WHERE l.run_id = 'r1'
    ),
    TRUE,
    'within a run event_id order equals seq order'
);
SELECT results_eq(
    $$SELECT type, lane, payload, transport_only, state, delivery_attempts, lease_owner, delivered_at
      FROM runrelay.ledger WHERE run_id = 'r1' AND seq = 2$$,
    $$VALUES ('a', 'lifecycle', '{}'::jsonb, FALSE, 'pending', 0, NULL::text, NULL::timestamptz)$$,
    'defaults: lifecycle lane, payload {}, not transport-only, pending, no attempts, no lease'
);
SELECT is(
    (
        SELECT next_attempt_at <= runrelay._now() FROM runrelay.ledger
        WHERE run_id = 'r1' AND seq = 2
    ),
    TRUE,
    'a new event is due at once'
);

SELECT results_eq(
    $$SELECT seq, delivery_key FROM runrelay.append_events('r1', '[
        {"type": "obs", "lane": "observability", "payload": {"p": 1}, "transport_only": true},
        {"type": "keyed", "delivery_key": "order-42/shipped"},
        {"type": "after-keyed"}
    ]')$$,
    $$VALUES (5::bigint, 'r1:5'), (6::bigint, 'order-42/shipped'), (7::bigint, 'r1:7')$$,
    'a second call continues the run''s seq; seq spans both lanes; explicit keys are kept, others default'
);
SELECT results_eq(
    $$SELECT lane, payload, transport_only FROM runrelay.ledger WHERE run_id = 'r1' AND type = 'obs'$$,
    $$VALUES ('observability', '{"p": 1}'::jsonb, TRUE)$$,
    'lane, payload and transport_only are stored as given'
);
SELECT is(
    (
        SELECT payload FROM runrelay.ledger
        WHERE run_id = 'r1' AND type = 'keyed'
    ),
    '{}'::jsonb,
    'an omitted payload is {}'
);
SELECT is(
    (SELECT bool_and(d.seq > d.prev) FROM (
        SELECT
            l.seq,
            lag(l.seq) OVER (ORDER BY l.event_id) AS prev
        FROM runrelay.ledger AS l
        WHERE l.run_id = 'r1'
    ) AS d
    WHERE d.prev IS NOT NULL),
    TRUE,
    'seq is strictly increasing per run'
);

SELECT runrelay.enqueue_run('r2');
SELECT results_eq(
    $$SELECT seq, delivery_key FROM runrelay.append_events('r2', '[{"type": "a", "lane": "observability"}]')$$,
    $$VALUES (2::bigint, 'r2:2')$$,
    'another run has its own seq'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.append_events('r2', '[]')$$,
    'an empty array appends nothing'
);
SELECT results_eq(
    $$SELECT seq FROM runrelay.append_events('r2', '[{"type": "z"}]')$$,
    $$VALUES (3::bigint)$$,
    'after an empty append the next event still gets the next seq'
);

-- An ended run still accepts events (compensations, late facts).
SELECT tests.start_run('done');
SELECT runrelay.complete_attempt('done', 1, tests.token('done'));
SELECT isnt_empty(
    $$SELECT * FROM runrelay.append_events('done', '[{"type": "late.fact"}]')$$,
    'a completed run accepts appends'
);
SELECT is(
    (
        SELECT type FROM runrelay.ledger
        WHERE run_id = 'done'
        ORDER BY seq DESC LIMIT 1
    ),
    'late.fact',
    'the late event lands after the terminal event'
);

-- Bad input: 22023.
SELECT throws_ok($$SELECT runrelay.append_events('nope', '[{"type": "a"}]')$$, '22023', NULL, 'unknown run');
SELECT throws_ok($$SELECT runrelay.append_events(NULL, '[{"type": "a"}]')$$, '22023', NULL, 'null run_id');
SELECT throws_ok($$SELECT runrelay.append_events('', '[{"type": "a"}]')$$, '22023', NULL, 'empty run_id');
SELECT throws_ok($$SELECT runrelay.append_events('r1', NULL)$$, '22023', NULL, 'null events');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '{"type": "a"}')$$, '22023', NULL, 'events not an array');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[1]')$$, '22023', NULL, 'an element that is not an object');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"payload": {}}]')$$, '22023', NULL, 'missing type');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": 5}]')$$, '22023', NULL, 'type not a string');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": ""}]')$$, '22023', NULL, 'empty type');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": "a", "lane": "audit"}]')$$, '22023', NULL, 'unknown lane');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": "a", "lane": 1}]')$$, '22023', NULL, 'lane not a string');
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', '[{"type": "a", "transport_only": "yes"}]')$$, '22023', NULL,
    'transport_only not a boolean'
);
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": "a", "delivery_key": 7}]')$$, '22023', NULL, 'delivery_key not a string');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": "a", "delivery_key": ""}]')$$, '22023', NULL, 'empty delivery_key');
SELECT throws_ok($$SELECT runrelay.append_events('r1', '[{"type": "a", "colour": "red"}]')$$, '22023', NULL, 'unknown field');
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', '[{"type": "a", "delivery_key": "k1"}, {"type": "b", "delivery_key": "k1"}]')$$,
    '22023', NULL, 'duplicate delivery keys within the array'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('r2', '[{"type": "a", "delivery_key": "order-42/shipped"}]')$$,
    '22023', NULL, 'a delivery key already used (by any run)'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', '[{"type": "a", "delivery_key": "r1:2"}]')$$,
    '22023', NULL, 'an explicit key equal to an existing default key'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', '[{"type": "a", "delivery_key": "r2:99"}]')$$,
    '22023', NULL, 'an explicit key of the reserved form <run_id>:<seq>'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', (SELECT jsonb_agg(jsonb_build_object('type', 't')) FROM generate_series(1, 1001)))$$,
    '22023', NULL, 'more than 1000 events'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger
        WHERE run_id = 'r1'
    ), 7::bigint,
    'the rejected calls appended nothing'
);

-- Oversized: 54000.
UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT throws_ok(
    $$SELECT runrelay.append_events('r1', jsonb_build_array(jsonb_build_object('type', 'big', 'payload', repeat('x', 2000))))$$,
    '54000', NULL, 'an event beyond max_payload_bytes raises 54000'
);
SELECT lives_ok(
    $$SELECT runrelay.append_events('r1', jsonb_build_array(jsonb_build_object('type', 'small', 'payload', repeat('x', 500))))$$,
    'an event within max_payload_bytes is accepted'
);
UPDATE runrelay.settings SET max_payload_bytes = 1048576;

-- An explicit key must never take a default key a run enqueued later needs:
-- either append_events rejects it (22023), or the later run works.
SELECT lives_ok(
    $q$DO $$
    BEGIN
        BEGIN
            PERFORM runrelay.append_events('r1', '[{"type": "x", "delivery_key": "later:1"}]');
        EXCEPTION WHEN invalid_parameter_value THEN
            NULL;
        END;
        PERFORM runrelay.enqueue_run('later');
    END
    $$$q$,
    'an explicit key of the form <future run_id>:<n> does not break enqueue_run of that run'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger
        WHERE run_id = 'r1'
    ), 8::bigint,
    'r1 has its 7 events and the small one'
);

SELECT * FROM finish();
ROLLBACK;
