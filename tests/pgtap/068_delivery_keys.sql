-- Delivery keys stay unique with an index of explicit keys only: the unique
-- index leaves out each event's own default key <run_id>:<seq>; explicit
-- keys are unique against each other (the index) and against default keys
-- (the reserved form is refused); the default keys of a run's whole life are
-- distinct; and a refused key writes nothing. (That the lookups of explicit
-- keys use the index is tested in tests/python/test_plans_young_install.py.)
BEGIN;
SELECT plan(9);

SELECT tests.clear_runs();

SELECT is(
    (
        SELECT indexdef FROM pg_indexes
        WHERE schemaname = 'runrelay' AND indexname = 'ledger_delivery_key_unique'
    ),
    'CREATE UNIQUE INDEX ledger_delivery_key_unique ON runrelay.ledger_events USING btree (delivery_key) '
    || 'WHERE (delivery_key <> ((run_id || '':''::text) || (seq)::text))',
    'the unique index holds the keys that are not their event''s default key'
);

-- A run's whole life with default keys: queued, started, an appended event,
-- completed.
SELECT tests.start_run('a');
SELECT runrelay.append_events('a', '[{"type": "order.paid"}, {"type": "log", "lane": "observability"}]');
SELECT runrelay.complete_attempt('a', 1, tests.token('a'));
SELECT results_eq(
    $$SELECT seq, delivery_key FROM runrelay.ledger_events WHERE run_id = 'a' ORDER BY seq$$,
    $$VALUES (1::bigint, 'a:1'), (2::bigint, 'a:2'), (3::bigint, 'a:3'), (4::bigint, 'a:4'), (5::bigint, 'a:5')$$,
    'every event of a run''s life has its own default key'
);

SELECT runrelay.enqueue_run('b');
SELECT results_eq(
    $$SELECT seq, delivery_key FROM runrelay.append_events('b', '[{"type": "order.paid", "delivery_key": "order-7/paid"}]')$$,
    $$VALUES (2::bigint, 'order-7/paid')$$,
    'an explicit key is taken'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('a', '[{"type": "order.paid", "delivery_key": "order-7/paid"}]')$$,
    '22023', NULL, 'an explicit key another run holds is refused'
);
SELECT throws_ok(
    $$SELECT runrelay.append_events('b', '[{"type": "x", "delivery_key": "a:3"}]')$$,
    '22023', NULL, 'an explicit key equal to another run''s default key is refused (its form is reserved)'
);
SELECT tests.start_run('c');
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt(
        'c', 1, tests.token('c'), final_events => '[{"type": "order.paid", "delivery_key": "order-7/paid"}]'
    )$$,
    '22023', NULL, 'a completion whose final event names a used key is refused'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger_events
        WHERE run_id IN ('a', 'b', 'c')
    ),
    9::bigint,
    'the refused calls wrote nothing'
);

-- Beneath the functions' checks, the index itself refuses a second event
-- with an explicit key already held.
SELECT throws_ok(
    $$INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, delivery_key, created_at, next_attempt_at)
      VALUES ('b', 'lifecycle', 99, 'x', 'order-7/paid', now(), now())$$,
    '23505', 'duplicate key value violates unique constraint "ledger_delivery_key_unique"',
    'a second row with a held explicit key breaks the unique index'
);
SELECT lives_ok(
    $$INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, delivery_key, created_at, next_attempt_at)
      VALUES ('b', 'lifecycle', 98, 'x', 'b:98', now(), now())$$,
    'a row with its own default key is not in it'
);

SELECT * FROM finish();
ROLLBACK;
