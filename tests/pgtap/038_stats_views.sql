-- The stats views (SPEC §3.3): run_stats counts runs by queue and status;
-- ledger_stats counts events by lane and state, with the oldest pending age
-- and blocked heads.
BEGIN;
SELECT plan(12);

SELECT columns_are(
    'runrelay', 'run_stats',
    ARRAY['queue', 'status', 'runs', 'held_by_key', 'oldest_run_at', 'oldest_runnable_age_seconds'],
    'run_stats has its documented columns'
);
SELECT columns_are(
    'runrelay', 'ledger_stats',
    ARRAY[
        'lane', 'state', 'events', 'oldest_pending_age_seconds', 'blocked_heads',
        'oldest_deliverable_age_seconds', 'oldest_blocked_age_seconds'
    ],
    'ledger_stats has its documented columns'
);

-- Installation-wide counts: start from an empty database.
SELECT tests.clear_runs();
SELECT is_empty($$SELECT * FROM runrelay.run_stats$$, 'run_stats is empty without runs');
SELECT is_empty($$SELECT * FROM runrelay.ledger_stats$$, 'ledger_stats is empty without events');

-- Runs: two queued on q-a (one held behind a concurrency key), one running on q-b.
SELECT runrelay.enqueue_run(run_id => 'a1', queue => 'q-a', run_at => now() - interval '1 hour', concurrency_key => 'k');
SELECT runrelay.enqueue_run(run_id => 'a2', queue => 'q-a', run_at => now() - interval '2 hours', concurrency_key => 'k');
SELECT runrelay.enqueue_run(run_id => 'a3', queue => 'q-a', run_at => now() + interval '1 hour');
SELECT tests.start_run('b1');
SELECT results_eq(
    $$SELECT queue, status, runs, held_by_key, oldest_run_at FROM runrelay.run_stats ORDER BY queue, status$$,
    $$VALUES ('b1', 'running', 1::bigint, 0::bigint, NULL::timestamptz),
             ('q-a', 'queued', 3::bigint, 1::bigint, now() - interval '1 hour')$$,
    'runs by queue and status; held-by-key runs are counted and excluded from the oldest run_at'
);
SELECT cmp_ok(
    (
        SELECT oldest_runnable_age_seconds FROM runrelay.run_stats
        WHERE queue = 'q-a'
    )::numeric, '>=', 3600::numeric,
    'the oldest runnable age is that of the oldest runnable, unheld run'
);

-- Ledger: lifecycle has run.queued x4 + run.started; we shape states.
SELECT tests.append('a1', ARRAY['obs1', 'obs2'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'a1');
SELECT runrelay.ack_ledger(relay => 'x', run_id => 'a1', event_ids => tests.eids('a1', ARRAY['obs1']), claim_next => 1);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'a1');
SELECT runrelay.fail_ledger('x', ARRAY[tests.eid('a1', 'run.queued')], '{}', permanent => TRUE);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'a2');
SELECT results_eq(
    $$SELECT lane, state, events, blocked_heads FROM runrelay.ledger_stats ORDER BY lane, state$$,
    $$VALUES ('lifecycle', 'failed', 1::bigint, 1::bigint),
             ('lifecycle', 'leased', 1::bigint, 1::bigint),
             ('lifecycle', 'pending', 3::bigint, 1::bigint),
             ('observability', 'delivered', 1::bigint, 0::bigint),
             ('observability', 'leased', 1::bigint, 0::bigint)$$,
    'events by lane and state, with the blocked heads of the lane'
);
SELECT is(
    (
        SELECT oldest_pending_age_seconds FROM runrelay.ledger_stats
        WHERE lane = 'observability' AND state = 'delivered'
    ),
    NULL,
    'delivered events have no pending age'
);
SELECT cmp_ok(
    (
        SELECT oldest_pending_age_seconds FROM runrelay.ledger_stats
        WHERE lane = 'lifecycle' AND state = 'pending'
    )::numeric,
    '>=', 0::numeric,
    'pending events have an age'
);
SELECT runrelay.requeue_ledger_event(tests.eid('a1', 'run.queued'));
SELECT is(
    (
        SELECT sum(blocked_heads) FROM runrelay.ledger_stats
        WHERE lane = 'lifecycle'
    ), 0::numeric,
    'a requeue clears the blocked head'
);

-- Privileges: only the admin role reads the views.
SET LOCAL ROLE runrelay_admin;
SELECT lives_ok($$SELECT * FROM runrelay.run_stats, runrelay.ledger_stats$$, 'the admin role reads both views');
RESET ROLE;
SET LOCAL ROLE runrelay_relay;
SELECT throws_ok($$SELECT * FROM runrelay.ledger_stats$$, '42501', NULL, 'a relay cannot read ledger_stats');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
