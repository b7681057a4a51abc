-- settings.notifications: every kind is sent by default; _notifying gives a
-- kind's channel only while the setting names the kind (every notification
-- is sent to the channel it gives); an unknown kind raises whether or not
-- it would be sent; the setting takes the
-- five kinds only (anything else is 23514 and leaves it as it was); the
-- engine's writes are the same with every kind off. (Which notifications
-- reach a listener is tested end to end in tests/python/test_loops.py.)
BEGIN;
SELECT plan(16);

SELECT tests.clear_runs();

SELECT is(
    (SELECT notifications FROM runrelay.settings),
    ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel'],
    'by default an install sends every kind'
);
CREATE FUNCTION pg_temp.sent()
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT array_agg(n.channel ORDER BY k.i)
    FROM unnest(ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel']) WITH ORDINALITY AS k (kind, i)
    CROSS JOIN LATERAL runrelay._notifying(k.kind) AS n (channel);
$$;
SELECT is(
    pg_temp.sent(),
    ARRAY['runrelay_runs', 'runrelay_ledger', 'runrelay_terminal', 'runrelay_delivered', 'runrelay_cancel'],
    '_notifying gives every kind''s channel by default'
);

UPDATE runrelay.settings SET notifications = ARRAY['runs', 'ledger', 'delivered'];
SELECT is(
    pg_temp.sent(),
    ARRAY['runrelay_runs', 'runrelay_ledger', 'runrelay_delivered'],
    '_notifying gives only the kinds the setting names'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay._notifying('queue')$$, '22023', 'no NOTIFY channel of kind ''queue''',
    'an unknown kind raises'
);
UPDATE runrelay.settings SET notifications = '{}';
SELECT is(pg_temp.sent(), NULL, 'an empty setting sends nothing');
SELECT throws_ok(
    $$SELECT * FROM runrelay._notifying('queue')$$, '22023', NULL,
    'an unknown kind raises while nothing is sent'
);

-- Bad values: 23514 naming the rule, or 23502; the setting is unchanged.
UPDATE runrelay.settings SET notifications = ARRAY['runs'];
SELECT throws_ok(
    $$UPDATE runrelay.settings SET notifications = ARRAY['runs', 'queue']$$, '23514',
    'new row for relation "settings" violates check constraint "settings_notifications"',
    'a kind that does not exist is refused'
);
SELECT throws_ok(
    $$UPDATE runrelay.settings SET notifications = ARRAY['runs', NULL]$$, '23514', NULL,
    'a null kind is refused'
);
SELECT throws_ok(
    $$UPDATE runrelay.settings SET notifications = NULL$$, '23502', NULL,
    'a null setting is refused'
);
SELECT throws_ok(
    $$UPDATE runrelay.settings SET notifications = ARRAY['Runs']$$, '23514', NULL,
    'kinds are lower case, as the channel names'
);
SELECT is((SELECT notifications FROM runrelay.settings), ARRAY['runs'], 'a refused value changes nothing');

-- With every kind off, a run's life writes what it writes with them on:
-- the fast completion (its statement counts its rows beside _notifying), the
-- general one, a cancellation and an enqueue.
UPDATE runrelay.settings SET notifications = '{}';
SELECT tests.start_run('n1');
SELECT is(
    runrelay.complete_attempt('n1', 1, tests.token('n1'), '{"ok": 1}'), 'completed',
    'the fast completion completes with every kind off'
);
SELECT set_config('runrelay.reference_paths', 'on', TRUE);
SELECT tests.start_run('n2');
SELECT is(
    runrelay.complete_attempt('n2', 1, tests.token('n2'), '{"ok": 2}'), 'completed',
    'the general completion completes with every kind off'
);
SELECT set_config('runrelay.reference_paths', '', TRUE);
SELECT results_eq(
    $$SELECT run_id, status FROM runrelay.runs WHERE run_id IN ('n1', 'n2') ORDER BY run_id$$,
    $$VALUES ('n1', 'completed'), ('n2', 'completed')$$,
    'both runs are completed'
);
SELECT results_eq(
    $$SELECT run_id, seq, type FROM runrelay.ledger WHERE run_id IN ('n1', 'n2') ORDER BY run_id, seq$$,
    $$VALUES ('n1', 1::bigint, 'run.queued'), ('n1', 2, 'run.started'), ('n1', 3, 'run.completed'),
             ('n2', 1, 'run.queued'), ('n2', 2, 'run.started'), ('n2', 3, 'run.completed')$$,
    'with their lifecycle events'
);
SELECT tests.start_run('n3');
SELECT is(runrelay.cancel_run('n3'), 'cancelled', 'a cancellation of a held run applies with every kind off');

SELECT * FROM finish();
ROLLBACK;
