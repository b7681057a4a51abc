-- enqueue_runs: each item decided exactly as enqueue_run decides it. The same
-- items go once through sequential enqueue_run calls (run_ids and keys
-- prefixed A-) and once through one enqueue_runs call (prefixed B-), from the
-- same starting state; results, run rows, key order and run.queued events
-- must be equal. Then repeated run_ids inside one call, and bad input: 22023
-- naming items[i].<parameter>, nothing changed.
BEGIN;
SELECT plan(35);

-- The same items, enqueue_run one at a time; an item's missing keys are
-- enqueue_run's defaults, a JSON null is the parameter passed as NULL.
CREATE FUNCTION pg_temp.enqueue_one_by_one(p_items jsonb)
RETURNS SETOF runrelay.enqueue_run_result
LANGUAGE plpgsql
AS $$
DECLARE
    v_item jsonb;
BEGIN
    FOR v_item IN SELECT e.value FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e (value, n) ORDER BY e.n LOOP
        RETURN QUERY SELECT * FROM runrelay.enqueue_run(
            run_id => v_item ->> 'run_id',
            queue => CASE WHEN v_item ? 'queue' THEN v_item ->> 'queue' ELSE 'default' END,
            payload => CASE WHEN v_item ? 'payload' THEN v_item -> 'payload' ELSE '{}' END,
            run_at => CASE WHEN v_item ? 'run_at' THEN (v_item ->> 'run_at')::timestamptz ELSE now() END,
            priority => CASE WHEN v_item ? 'priority' THEN (v_item ->> 'priority')::integer ELSE 0 END,
            max_attempts => CASE WHEN v_item ? 'max_attempts' THEN (v_item ->> 'max_attempts')::integer ELSE 3 END,
            payload_retention => coalesce(v_item ->> 'payload_retention', 'keep'),
            concurrency_key => v_item ->> 'concurrency_key'
        );
    END LOOP;
END;
$$;

-- The scenario, P standing for the prefix. Before it: P0 exists and is
-- running; key P-k has a live run (P-k0); key P-j has none. The clock is an
-- hour ahead, so a null run_at (the clock) and a missing one (now()) differ.
CREATE TEMP TABLE scenario AS
SELECT $$[
    {"run_id": "P1", "queue": "bq", "payload": {"n": 1}, "priority": 3, "max_attempts": 5,
     "payload_retention": "drop_on_delivery"},
    {"run_id": "P2", "queue": "bq", "concurrency_key": "P-k"},
    {"run_id": "P3", "queue": "bq", "concurrency_key": "P-j", "payload": {"n": 3}},
    {"run_id": "P4", "queue": "bq", "concurrency_key": "P-j"},
    {"run_id": "P1", "queue": "bq", "payload": {"n": 1}, "priority": 9},
    {"run_id": "P0", "queue": "P0"},
    {"run_id": "P5", "queue": "bq", "run_at": "2099-01-01T00:00:00Z"},
    {"run_id": "P6", "queue": "bq", "concurrency_key": "P-j", "run_at": null},
    {"run_id": "P7", "queue": "bq2", "concurrency_key": null, "priority": -4},
    {"run_id": "P4", "queue": "bq", "payload": {}}
]$$::text AS items;

-- The scenario's items for one side: P becomes p_side in run_ids and keys.
CREATE FUNCTION pg_temp.side_items(p_side text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT replace(s.items, '"P', '"' || p_side)::jsonb FROM scenario AS s;
$$;

SELECT tests.set_clock('1 hour');
SELECT tests.start_run('A0');
SELECT tests.start_run('B0');
SELECT * FROM runrelay.enqueue_run('A-k0', queue => 'bq', concurrency_key => 'A-k');
SELECT * FROM runrelay.enqueue_run('B-k0', queue => 'bq', concurrency_key => 'B-k');

CREATE TEMP TABLE got_a AS
SELECT r.* FROM pg_temp.enqueue_one_by_one(pg_temp.side_items('A')) WITH ORDINALITY AS r (run_id, status, created, n);
CREATE TEMP TABLE got_b AS
SELECT r.* FROM runrelay.enqueue_runs(pg_temp.side_items('B')) WITH ORDINALITY AS r (run_id, status, created, n);

SELECT results_eq(
    'SELECT n, substr(run_id, 2), status, created FROM got_b ORDER BY n',
    'SELECT n, substr(run_id, 2), status, created FROM got_a ORDER BY n',
    'enqueue_runs answers every item as sequential enqueue_run calls do'
);
SELECT results_eq(
    'SELECT substr(run_id, 2), status, created FROM got_b ORDER BY n',
    $$VALUES ('1', 'queued', TRUE), ('2', 'queued', TRUE), ('3', 'queued', TRUE), ('4', 'queued', TRUE),
             ('1', 'queued', FALSE), ('0', 'running', FALSE), ('5', 'queued', TRUE), ('6', 'queued', TRUE),
             ('7', 'queued', TRUE), ('4', 'queued', FALSE)$$,
    'one row per item in item order: created, a repeat of an earlier item, an existing run'
);

CREATE TEMP VIEW bulk_runs AS
SELECT
    left(r.run_id, 1) AS side,
    substr(r.run_id, 2) AS run_id,
    regexp_replace(r.queue, '^[AB]', 'P') AS queue,
    r.status,
    r.payload,
    r.priority,
    r.max_attempts,
    r.payload_retention,
    r.attempt_count,
    -- run 6's run_at is the clock when its own statement ran: checked below.
    CASE WHEN r.run_id !~ '6$' THEN r.run_at END AS run_at,
    r.ledger_seq,
    replace(replace(r.concurrency_key, 'A-', ''), 'B-', '') AS concurrency_key,
    r.key_held,
    rank() OVER (PARTITION BY r.concurrency_key ORDER BY r.key_position) AS key_rank
FROM runrelay.runs AS r
WHERE r.run_id ~ '^[AB]';

SELECT results_eq(
    $$SELECT run_id, queue, status, payload, priority, max_attempts, payload_retention, attempt_count, run_at,
             ledger_seq, concurrency_key, key_held, key_rank
      FROM bulk_runs WHERE side = 'B' ORDER BY run_id$$,
    $$SELECT run_id, queue, status, payload, priority, max_attempts, payload_retention, attempt_count, run_at,
             ledger_seq, concurrency_key, key_held, key_rank
      FROM bulk_runs WHERE side = 'A' ORDER BY run_id$$,
    'the run rows equal those of sequential enqueue_run calls (fields, run_at defaults, key positions, key_held)'
);
SELECT results_eq(
    $$SELECT run_id, key_held, key_rank FROM bulk_runs WHERE side = 'B' AND concurrency_key IS NOT NULL ORDER BY run_id$$,
    $$VALUES ('-k0', FALSE, 1::bigint), ('2', TRUE, 2::bigint),
             ('3', FALSE, 1::bigint), ('4', TRUE, 2::bigint), ('6', TRUE, 3::bigint)$$,
    'keys: behind a live run every new run is held; a new key''s first item is its head, later items held, in item order'
);
SELECT is(
    (
        SELECT payload FROM runrelay.runs
        WHERE run_id = 'B1'
    ), '{"n": 1}'::jsonb,
    'a repeat inside the call does not change the run its first item created (priority 3 kept)'
);
SELECT ok(
    (
        SELECT run_at FROM runrelay.runs
        WHERE run_id = 'B6'
    ) > now() + interval '59 minutes'
    AND (
        SELECT run_at FROM runrelay.runs
        WHERE run_id = 'B7'
    ) = now(),
    'run_at: null is the database clock, missing is now(), as enqueue_run'
);

CREATE TEMP VIEW bulk_events AS
SELECT
    left(l.run_id, 1) AS side,
    substr(l.run_id, 2) AS run_id,
    l.lane,
    l.seq,
    l.type,
    l.transport_only,
    l.payload - 'concurrency_key' - CASE WHEN l.run_id ~ '6$' THEN 'run_at' ELSE '' END AS payload,
    replace(replace(l.payload ->> 'concurrency_key', 'A-', ''), 'B-', '') AS concurrency_key
FROM runrelay.ledger AS l
WHERE l.run_id ~ '^[AB]' AND l.run_id !~ '^[AB]0$';

SELECT results_eq(
    $$SELECT run_id, lane, seq, type, transport_only, payload, concurrency_key FROM bulk_events
      WHERE side = 'B' ORDER BY run_id, seq$$,
    $$SELECT run_id, lane, seq, type, transport_only, payload, concurrency_key FROM bulk_events
      WHERE side = 'A' ORDER BY run_id, seq$$,
    'run.queued events equal those of sequential enqueue_run calls'
);
SELECT is(
    (
        SELECT count(*) FROM bulk_events
        WHERE side = 'B' AND run_id <> '-k0' AND type = 'run.queued'
    ), 7::bigint,
    'exactly one run.queued per created run, none for repeats or existing runs'
);
SELECT results_eq(
    $$SELECT l.run_id, l.head_seq FROM runrelay.ledger_lanes AS l WHERE l.run_id IN ('B1', 'B5') ORDER BY l.run_id$$,
    $$VALUES ('B1', 1::bigint), ('B5', 1::bigint)$$,
    'the created runs'' lifecycle lanes are woken at run.queued'
);

-- A replay of the whole call writes nothing.
SELECT results_eq(
    $$SELECT r.created, count(*) FROM runrelay.enqueue_runs(pg_temp.side_items('B')) AS r GROUP BY r.created$$,
    $$VALUES (FALSE, 10::bigint)$$,
    'a repeat of the whole call answers created = false for every item'
);
SELECT is((
    SELECT count(*) FROM bulk_events
    WHERE side = 'B'
), 8::bigint, 'a repeat of the whole call emits nothing');

-- Repeated run_ids in one call: the first item decides, as sequential calls.
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "d1", "payload": {"a": 1}}, {"run_id": "d1", "payload": {"a": 1}}]')$$,
    $$VALUES ('d1', 'queued', TRUE), ('d1', 'queued', FALSE)$$,
    'a run_id repeated with the same queue and payload: created once, then its repeat'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "d2", "payload": {"a": 1}}, {"run_id": "d2", "payload": {"a": 2}}]')$$,
    '22023', 'runrelay: invalid items[1].run_id: run "d2" already exists with a different queue or payload (or task)',
    'a run_id repeated with another payload raises as the second enqueue_run would'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "d3"}, {"run_id": "d3", "queue": "other"}]')$$,
    '22023', NULL, 'a run_id repeated on another queue raises'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs
        WHERE run_id IN ('d2', 'd3')
    ), 0::bigint,
    'a call whose repeated run_id conflicts creates nothing, not even the first item'
);

-- Conflicting with an existing run: the whole call changes nothing.
CREATE TEMP TABLE before AS
SELECT
    (SELECT count(*) FROM runrelay.runs) AS runs,
    (SELECT count(*) FROM runrelay.ledger) AS events,
    (SELECT last_value FROM runrelay.runs_key_position_seq) AS positions;
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "c1", "concurrency_key": "ck"}, {"run_id": "B1", "queue": "bq"}]')$$,
    '22023', 'runrelay: invalid items[1].run_id: run "B1" already exists with a different queue or payload (or task)',
    'an item naming an existing run with another payload raises the error enqueue_run raises, with the item index'
);

-- Bad input: 22023 naming the parameter and the item, nothing changed.
SELECT throws_ok(format('SELECT * FROM runrelay.enqueue_runs(%L)', c.items), '22023', c.message, c.description)
FROM (
    VALUES
    (NULL::jsonb, NULL, 'items null'),
    ('{"run_id": "x"}', NULL, 'items not an array'),
    ('[]', NULL, 'no items'),
    ((SELECT jsonb_agg(jsonb_build_object('run_id', 'big' || g)) FROM generate_series(1, 10001) AS g), NULL, 'more than 10000 items'),
    ('[{"run_id": "x1"}, 7]', 'runrelay: invalid items[1]: must be a JSON object (got number)', 'an item not an object'),
    ('[{"run_id": "x1", "lane": "a"}]', 'runrelay: invalid items[0].lane: is not a parameter of enqueue_run', 'an unknown key'),
    ('[{"queue": "q"}]', 'runrelay: invalid items[0].run_id: must not be null', 'a missing run_id'),
    ('[{"run_id": 5}]', 'runrelay: invalid items[0].run_id: must be a JSON string (got number)', 'a run_id not a string'),
    ('[{"run_id": "x1"}, {"run_id": "x2", "queue": " "}]', NULL, 'a blank queue'),
    ('[{"run_id": "x1", "payload": null}]', 'runrelay: invalid items[0].payload: must not be null', 'a null payload'),
    ('[{"run_id": "x1", "run_at": "soon"}]', NULL, 'a run_at that is not a timestamp'),
    ('[{"run_id": "x1", "run_at": "infinity"}]', 'runrelay: invalid items[0].run_at: must be finite (got infinity)', 'an infinite run_at'),
    ('[{"run_id": "x1", "priority": 1.5}]', NULL, 'a priority that is not an integer'),
    (
        '[{"run_id": "x1", "priority": 2000000}]',
        'runrelay: invalid items[0].priority: must be between -1000000 and 1000000 (got 2000000)', 'a priority out of range'
    ),
    (
        '[{"run_id": "x1"}, {"run_id": "x2", "max_attempts": 0}]',
        'runrelay: invalid items[1].max_attempts: must be between 1 and 1000 (got 0)', 'max_attempts 0'
    ),
    ('[{"run_id": "x1", "payload_retention": "forever"}]', NULL, 'an unknown payload_retention'),
    (
        jsonb_build_array(jsonb_build_object('run_id', 'x1', 'concurrency_key', repeat('k', 201))),
        NULL, 'a concurrency_key over 200 characters'
    )
) AS c (items, message, description);
UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs(jsonb_build_array(
        jsonb_build_object('run_id', 'x1'), jsonb_build_object('run_id', 'x2', 'payload', jsonb_build_object('pad', repeat('x', 2000)))))$$,
    '54000', NULL, 'a payload over settings.max_payload_bytes raises 54000, as enqueue_run'
);
SELECT results_eq(
    $$SELECT (SELECT count(*) FROM runrelay.runs), (SELECT count(*) FROM runrelay.ledger),
             (SELECT last_value FROM runrelay.runs_key_position_seq)$$,
    $$SELECT runs, events, positions FROM before$$,
    'no call that raised created a run, an event or took a key position'
);

SELECT * FROM finish();
ROLLBACK;
