-- list_blocked_heads and requeue_blocked_heads (docs/admin.md): the lanes
-- blocked behind a failed head with the head's last error, by run and lane,
-- a page at a time; requeueing one run's lane, one run's lanes, or every
-- blocked lane of a kind, at most max_lanes per call, every failed event
-- from the head on, as requeue_ledger_event does; 22023 for bad input.
BEGIN;
SELECT plan(29);

-- Lanes are installation-wide: start from no runs.
SELECT tests.clear_runs();

-- Fail a relay's claim of a run lane's head permanently: the head alone on
-- the lifecycle lane, a batch of up to ten on the observability lane.
CREATE FUNCTION pg_temp.block(p_run_id text, p_lane text, p_error jsonb)
RETURNS void
LANGUAGE sql
AS $$
    SELECT runrelay.fail_ledger('x', array_agg(c.event_id), p_error, permanent => TRUE)
    FROM runrelay.claim_ledger(
        relay => 'x', lane => p_lane, run_id => p_run_id, max_events => 10, batch => p_lane = 'observability'
    ) AS c;
$$;

SELECT tests.ledger_run('b1');
SELECT tests.ledger_run('b2');
SELECT tests.ledger_run('b3');
SELECT tests.append('b1', ARRAY['a1', 'a2']);
SELECT tests.append('b1', ARRAY['o1', 'o2'], 'observability');
SELECT tests.append('b2', ARRAY['a1']);
SELECT tests.append('b3', ARRAY['a1']);
SELECT pg_temp.block('b1', 'lifecycle', '{"http": 500}');
SELECT pg_temp.block('b1', 'observability', '{"http": 400}');
SELECT pg_temp.block('b2', 'lifecycle', '{"http": 503}');
-- b3's head fails but has attempts left: retrying, not blocked.
SELECT runrelay.fail_ledger('x', array_agg(c.event_id), '{"http": 502}')
FROM runrelay.claim_ledger(relay => 'x', run_id => 'b3') AS c;

SELECT results_eq(
    $$SELECT run_id, lane, type, delivery_attempts, last_error, failed_at IS NOT NULL
      FROM runrelay.list_blocked_heads()$$,
    $$VALUES ('b1', 'lifecycle', 'a1', 1, '{"http": 500}'::jsonb, TRUE),
             ('b1', 'observability', 'o1', 1, '{"http": 400}'::jsonb, TRUE),
             ('b2', 'lifecycle', 'a1', 1, '{"http": 503}'::jsonb, TRUE)$$,
    'every blocked lane with its failed head and last error, by run and lane; a retrying head is not blocked'
);
SELECT is(
    array(SELECT h.event_id FROM runrelay.list_blocked_heads(run_id => 'b2') AS h),
    ARRAY[tests.eid('b2', 'a1')],
    'one run''s, with the head''s event_id'
);
SELECT is(
    array(SELECT h.run_id FROM runrelay.list_blocked_heads(lane => 'lifecycle') AS h), ARRAY['b1', 'b2'],
    'one lane kind'
);
SELECT is(
    array(SELECT h.run_id || '/' || h.lane FROM runrelay.list_blocked_heads(max_rows => 2) AS h),
    ARRAY['b1/lifecycle', 'b1/observability'],
    'page 1'
);
SELECT is(
    array(
        SELECT h.run_id || '/' || h.lane FROM runrelay.list_blocked_heads(
            max_rows => 2, after_run_id => 'b1', after_lane => 'observability'
        ) AS h
    ),
    ARRAY['b2/lifecycle'],
    'page 2 starts after the last row of page 1'
);
SELECT is(
    (SELECT count(*) FROM runrelay.list_blocked_heads(run_id => 'b3')), 0::bigint, 'a retrying lane is not listed'
);
SELECT is((SELECT count(*) FROM runrelay.list_blocked_heads(run_id => 'nobody')), 0::bigint, 'an unknown run: no row');

-- Requeue one run's lane: both failed events of its batch.
SELECT results_eq(
    $$SELECT run_id, lane, requeued FROM runrelay.requeue_blocked_heads(run_id => 'b1', lane => 'observability')$$,
    $$VALUES ('b1', 'observability', 2)$$,
    'one run''s lane: its two failed events'
);
SELECT is(
    tests.ledger_states('b1'),
    ARRAY['run.queued=delivered:fixture', 'a1=failed', 'a2=pending', 'o1=pending', 'o2=pending'],
    'the lane''s events are pending again; the other lane stays blocked'
);
SELECT results_eq(
    $$SELECT delivery_attempts, last_error, next_attempt_at <= statement_timestamp()
      FROM runrelay.ledger WHERE event_id = tests.eid('b1', 'o1')$$,
    $$VALUES (0, '{"http": 400}'::jsonb, TRUE)$$,
    'as requeue_ledger_event leaves an event: attempts reset, due now, last_error kept'
);
SELECT is(
    (
        SELECT blocked FROM runrelay.ledger_lanes
        WHERE run_id = 'b1' AND lane = 'observability'
    ), FALSE, 'the lane is unblocked'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', lane => 'observability', run_id => 'b1')$$,
    $$VALUES ('claimed', 'o1'), ('claimed', 'o2')$$,
    'and its head is claimable at once, with its frozen batch'
);

-- Requeue every blocked lane of a kind, at most max_lanes a call.
SELECT results_eq(
    $$SELECT run_id, lane, requeued FROM runrelay.requeue_blocked_heads(lane => 'lifecycle', max_lanes => 1)$$,
    $$VALUES ('b1', 'lifecycle', 1)$$,
    'max_lanes bounds a call: the first blocked lane'
);
SELECT results_eq(
    $$SELECT run_id, lane, requeued FROM runrelay.requeue_blocked_heads(lane => 'lifecycle')$$,
    $$VALUES ('b2', 'lifecycle', 1)$$,
    'the next call: the rest'
);
SELECT is(
    (SELECT count(*) FROM runrelay.requeue_blocked_heads()), 0::bigint, 'nothing blocked: no row'
);
SELECT is((SELECT count(*) FROM runrelay.list_blocked_heads()), 0::bigint, 'no lane is blocked');
SELECT is(tests.ev_state(tests.eid('b3', 'a1')), 'pending', 'a retrying head is left as it is');

-- A run's lanes; a run id alone.
SELECT pg_temp.block('b2', 'lifecycle', '{"again": true}');
SELECT tests.append('b2', ARRAY['o1'], 'observability');
SELECT pg_temp.block('b2', 'observability', '{"again": true}');
SELECT results_eq(
    $$SELECT run_id, lane, requeued FROM runrelay.requeue_blocked_heads(run_id => 'b2')$$,
    $$VALUES ('b2', 'lifecycle', 1), ('b2', 'observability', 1)$$,
    'a run id alone: both its lanes'
);
SELECT is((SELECT count(*) FROM runrelay.requeue_blocked_heads(run_id => 'nobody')), 0::bigint, 'an unknown run: no row');

-- requeue_ledger_event still answers as before (it shares _requeue_failed).
SELECT tests.ledger_run('b4');
SELECT tests.append('b4', ARRAY['a1']);
SELECT pg_temp.block('b4', 'lifecycle', '{"gone": true}');
SELECT is(runrelay.requeue_ledger_event(tests.eid('b4', 'a1')), TRUE, 'requeue_ledger_event of a failed head: true');
SELECT is(runrelay.requeue_ledger_event(tests.eid('b4', 'a1')), FALSE, '... then false: it is pending');

-- Bad input.
SELECT throws_ok($$SELECT * FROM runrelay.list_blocked_heads(lane => 'audit')$$, '22023', NULL, 'list: unknown lane');
SELECT throws_ok($$SELECT * FROM runrelay.list_blocked_heads(run_id => '')$$, '22023', NULL, 'list: empty run_id');
SELECT throws_ok(
    $$SELECT * FROM runrelay.list_blocked_heads(after_run_id => 'b1')$$, '22023', NULL, 'list: after_run_id without after_lane'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.list_blocked_heads(after_run_id => 'b1', after_lane => 'x')$$, '22023', NULL, 'list: unknown after_lane'
);
SELECT throws_ok($$SELECT * FROM runrelay.list_blocked_heads(max_rows => 0)$$, '22023', NULL, 'list: max_rows 0');
SELECT throws_ok($$SELECT * FROM runrelay.requeue_blocked_heads(lane => 'audit')$$, '22023', NULL, 'requeue: unknown lane');
SELECT throws_ok($$SELECT * FROM runrelay.requeue_blocked_heads(run_id => ' ')$$, '22023', NULL, 'requeue: blank run_id');
SELECT throws_ok($$SELECT * FROM runrelay.requeue_blocked_heads(max_lanes => 1001)$$, '22023', NULL, 'requeue: max_lanes 1001');

SELECT * FROM finish();
ROLLBACK;
