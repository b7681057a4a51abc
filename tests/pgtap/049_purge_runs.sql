-- purge_runs (docs/admin.md): deletes ended runs that ended before the
-- cut-off, oldest created first, at most max_rows a call, with their
-- attempts, signals, ledger events, lanes, wake-ups, calls and cancel
-- markers; keeps live runs, runs that ended later, and (unless
-- include_undelivered) runs whose ledger is not delivered; 22023 for bad
-- input.
BEGIN;
SELECT plan(25);

-- purge_runs is installation-wide: start from no runs.
SELECT tests.clear_runs();

-- Deliver every event of a run (relay 'x'), so that it can be purged.
CREATE FUNCTION pg_temp.deliver(p_run_id text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_lane text;
    v_ids bigint[];
BEGIN
    FOREACH v_lane IN ARRAY ARRAY['lifecycle', 'observability'] LOOP
        LOOP
            v_ids := ARRAY(
                SELECT c.event_id FROM runrelay.claim_ledger(
                    relay => 'x', lane => v_lane, run_id => p_run_id, max_events => 100, batch => TRUE
                ) AS c
                WHERE c.kind = 'claimed'
            );
            EXIT WHEN cardinality(v_ids) = 0;
            PERFORM runrelay.ack_ledger(relay => 'x', run_id => p_run_id, event_ids => v_ids);
        END LOOP;
    END LOOP;
END;
$$;

-- tests.start_run on the shifted clock: due a day before the real one.
CREATE FUNCTION pg_temp.start(p_run_id text, p_max_attempts integer DEFAULT 3)
RETURNS tests.claim
LANGUAGE sql
AS $$
    SELECT runrelay.enqueue_run(p_run_id, p_run_id, run_at => now() - interval '1 day', max_attempts => p_max_attempts);
    SELECT tests.claim_run(p_run_id);
$$;

-- Everything of a run, as one count per table.
CREATE FUNCTION pg_temp.rows_of(p_run_id text)
RETURNS bigint[]
LANGUAGE sql
AS $$
    SELECT ARRAY[
        (SELECT count(*) FROM runrelay.runs AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.attempts AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.signals AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.ledger_events AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.ledger_lanes AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.calls AS t WHERE t.run_id = p_run_id),
        (SELECT count(*) FROM runrelay.cancellations AS t WHERE t.run_id = p_run_id)
    ];
$$;

-- Fixtures, ended at -5 h (e1, e2, e3: created in that order), -3 h (e4)
-- and now (e5); e6 ended at -5 h with an undelivered event; live runs.
SELECT tests.set_clock('-6 hours');
SELECT pg_temp.start('e1');
SELECT pg_temp.start('e2', p_max_attempts => 1);
SELECT runrelay.enqueue_run('e3', 'e3');
SELECT pg_temp.start('e6');
SELECT tests.set_clock('-5 hours');
SELECT runrelay.signal_run('e1', 'later', '{"stored": true}');
SELECT runrelay.complete_attempt('e1', 1, tests.token('e1'), '{"ok": 1}');
SELECT runrelay.fail_attempt('e2', 1, tests.token('e2'), '{"e": 1}');
SELECT runrelay.cancel_run('e3', 'no', call_id => '00000000-0000-4000-8000-0000000000e3');
SELECT runrelay.complete_attempt('e6', 1, tests.token('e6'));
SELECT tests.set_clock('-4 hours');
SELECT pg_temp.start('e4');
SELECT tests.set_clock('-3 hours');
SELECT runrelay.complete_attempt('e4', 1, tests.token('e4'));
SELECT tests.set_clock('0');
SELECT tests.start_run('e5');
SELECT runrelay.complete_attempt('e5', 1, tests.token('e5'));
SELECT runrelay.enqueue_run('l1', 'l1', run_at => now() - interval '1 day');
SELECT tests.start_run('l2');
SELECT tests.start_waiting('l3', '{"kind": "event", "name": "go"}');
SELECT pg_temp.deliver(r) FROM unnest(ARRAY['e1', 'e2', 'e3', 'e4', 'e5', 'l1', 'l2', 'l3']) AS r;
SELECT runrelay.append_events('e6', '[{"type": "late", "lane": "observability"}]');
-- A stale marker on an ended run (cancel_run drops its own; this one is left).
SELECT tests.mark_cancel('e2', 'stale');

SELECT is(
    pg_temp.rows_of('e1'), ARRAY[1, 1, 1, 3, 1, 0, 0]::bigint[],
    'fixture: e1 with its attempt, a stored signal, three delivered events and its lane'
);
SELECT is(pg_temp.rows_of('e3'), ARRAY[1, 0, 0, 2, 1, 1, 0]::bigint[], 'fixture: e3 with its cancel_run call record');
SELECT is(pg_temp.rows_of('e2'), ARRAY[1, 1, 0, 3, 1, 0, 1]::bigint[], 'fixture: e2 with a stale cancel marker');

SELECT is(runrelay.purge_runs(now() - interval '6 hours'), 0, 'nothing ended before the cut-off: 0');
SELECT is(runrelay.purge_runs(now() - interval '4 hours', max_rows => 2), 2, 'max_rows bounds a call');
SELECT is(
    array(
        SELECT r.run_id FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'e%'
        ORDER BY r.run_id
    ),
    ARRAY['e3', 'e4', 'e5', 'e6'],
    'the oldest created went first (e1, e2)'
);
SELECT is(pg_temp.rows_of('e1'), ARRAY[0, 0, 0, 0, 0, 0, 0]::bigint[], 'e1: every row gone: attempt, signal, events, lane');
SELECT is(pg_temp.rows_of('e2'), ARRAY[0, 0, 0, 0, 0, 0, 0]::bigint[], 'e2: its stale marker gone too');
SELECT is(runrelay.purge_runs(now() - interval '4 hours'), 1, 'the next call: the rest that ended before the cut-off');
SELECT is(pg_temp.rows_of('e3'), ARRAY[0, 0, 0, 0, 0, 0, 0]::bigint[], 'e3: its call record gone too');
SELECT is(
    runrelay.cancel_run('e3', 'no', call_id => '00000000-0000-4000-8000-0000000000e3'), 'not_found',
    'the purged run''s call is forgotten: a repeat is decided afresh'
);
SELECT is(runrelay.purge_runs(now() - interval '4 hours'), 0, 'then 0: e6 waits for its delivery');
SELECT is((pg_temp.rows_of('e6'))[1], 1::bigint, 'e6, ended before the cut-off but undelivered, stays');
SELECT is(
    array(
        SELECT r.run_id FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'e%'
        ORDER BY r.run_id
    ),
    ARRAY['e4', 'e5', 'e6'],
    'e4 and e5 ended after the cut-off: kept'
);
SELECT is(runrelay.purge_runs(now() - interval '4 hours', include_undelivered => TRUE), 1, 'include_undelivered: e6 too');
SELECT is(pg_temp.rows_of('e6'), ARRAY[0, 0, 0, 0, 0, 0, 0]::bigint[], 'e6: its undelivered event gone with it');
SELECT is(runrelay.purge_runs(now() + interval '1 hour'), 2, 'a later cut-off: e4 and e5');
SELECT is(
    array(
        SELECT r.run_id || '=' || r.status FROM runrelay.runs AS r
        ORDER BY r.run_id
    ),
    ARRAY['l1=queued', 'l2=running', 'l3=waiting'],
    'live runs are never purged'
);
SELECT is(runrelay.purge_runs(now() + interval '1 hour', include_undelivered => TRUE), 0, 'nothing left to purge: 0');
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger_events AS l
        WHERE l.run_id NOT IN ('l1', 'l2', 'l3')
    ), 0::bigint,
    'no ledger row of a purged run is left'
);

-- Bad input.
SELECT throws_ok($$SELECT runrelay.purge_runs(NULL)$$, '22023', NULL, 'a null cut-off');
SELECT throws_ok($$SELECT runrelay.purge_runs('infinity')$$, '22023', NULL, 'an infinite cut-off');
SELECT throws_ok($$SELECT runrelay.purge_runs(now(), max_rows => 0)$$, '22023', NULL, 'max_rows 0');
SELECT throws_ok($$SELECT runrelay.purge_runs(now(), max_rows => 10001)$$, '22023', NULL, 'max_rows 10001');
SELECT throws_ok($$SELECT runrelay.purge_runs(now(), include_undelivered => NULL)$$, '22023', NULL, 'a null include_undelivered');

SELECT * FROM finish();
ROLLBACK;
