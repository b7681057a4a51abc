-- The admin functions (docs/admin.md) and SPEC §5: each is SECURITY
-- DEFINER, VOLATILE, with a pinned search_path and a COMMENT; EXECUTE is
-- granted to runrelay_admin and to nobody else, PUBLIC included; an admin
-- calls them without any table privilege, and the other roles are refused.
BEGIN;

CREATE TEMPORARY TABLE admin_fn (name text, call text) ON COMMIT DROP;
INSERT INTO admin_fn VALUES
('list_runs', $$SELECT * FROM runrelay.list_runs(queue => 'sec-none')$$),
('get_run', $$SELECT * FROM runrelay.get_run('sec-none')$$),
('run_attempts', $$SELECT * FROM runrelay.run_attempts('sec-none')$$),
('run_steps', $$SELECT * FROM runrelay.run_steps('sec-none')$$),
('run_ledger_events', $$SELECT * FROM runrelay.run_ledger_events('sec-none')$$),
('retry_run', $$SELECT runrelay.retry_run('sec-none')$$),
('list_blocked_heads', $$SELECT * FROM runrelay.list_blocked_heads(run_id => 'sec-none')$$),
('requeue_blocked_heads', $$SELECT * FROM runrelay.requeue_blocked_heads(run_id => 'sec-none')$$),
('pause_queue', $$SELECT runrelay.pause_queue('sec-none')$$),
('resume_queue', $$SELECT runrelay.resume_queue('sec-none')$$),
('list_paused_queues', $$SELECT * FROM runrelay.list_paused_queues()$$),
('purge_runs', $$SELECT runrelay.purge_runs('2000-01-01')$$),
('upsert_schedule', $$SELECT runrelay.upsert_schedule('sec-none', '@daily')$$),
('delete_schedule', $$SELECT runrelay.delete_schedule('sec-none')$$),
('list_schedules', $$SELECT * FROM runrelay.list_schedules()$$),
('queue_overview', $$SELECT * FROM runrelay.queue_overview()$$),
('ledger_overview', $$SELECT * FROM runrelay.ledger_overview()$$),
('skip_ledger_events', $$SELECT * FROM runrelay.skip_ledger_events('sec-none', 'lifecycle', 'r')$$),
('list_processes', $$SELECT * FROM runrelay.list_processes()$$);
-- Read by the roles below while they call each function.
GRANT SELECT ON admin_fn TO public;

-- Seven assertions per function, eight for the whole.
SELECT plan(8 + 7 * (SELECT count(*)::integer FROM admin_fn));

SELECT is(
    (
        SELECT count(*) FROM pg_proc AS p INNER JOIN admin_fn AS f ON p.proname = f.name
        WHERE p.pronamespace = 'runrelay'::regnamespace
    ),
    (SELECT count(*) FROM admin_fn),
    'each admin function exists exactly once (no stray overloads)'
);

-- Each admin function with its catalog row.
CREATE TEMPORARY VIEW admin_proc AS
SELECT
    f.name,
    p.oid,
    p.prosecdef,
    p.provolatile
FROM admin_fn AS f
INNER JOIN pg_proc AS p ON f.name = p.proname AND p.pronamespace = 'runrelay'::regnamespace;

SELECT
    ok(
        p.prosecdef AND p.provolatile = 'v' AND tests.pins_search_path(p.oid),
        p.name || ' is SECURITY DEFINER, VOLATILE and pins its search_path'
    )
FROM admin_proc AS p
ORDER BY p.name;
SELECT ok(coalesce(length(obj_description(p.oid, 'pg_proc')), 0) > 0, p.name || ' has a COMMENT ON FUNCTION')
FROM admin_proc AS p
ORDER BY p.name;
SELECT
    is(
        tests.execute_grantees(p.oid), ARRAY['runrelay_admin'],
        p.name || ': EXECUTE granted to runrelay_admin only (no PUBLIC, no other role)'
    )
FROM admin_proc AS p
ORDER BY p.name;

-- Calls as each role: the admin's succeed through SECURITY DEFINER alone.
SELECT table_privs_are('runrelay', 'runs', 'runrelay_admin', ARRAY[]::text[], 'admin has no privilege on runs');
SELECT table_privs_are('runrelay', 'attempts', 'runrelay_admin', ARRAY[]::text[], 'admin has no privilege on attempts');
SELECT table_privs_are('runrelay', 'ledger_events', 'runrelay_admin', ARRAY[]::text[], 'admin has no privilege on ledger_events');
SELECT table_privs_are('runrelay', 'ledger_lanes', 'runrelay_admin', ARRAY[]::text[], 'admin has no privilege on ledger_lanes');
SELECT table_privs_are('runrelay', 'queue_activity', 'runrelay_admin', ARRAY[]::text[], 'admin has no privilege on queue_activity');
SELECT table_privs_are(
    'runrelay', 'queue_activity_watermark', 'runrelay_admin', ARRAY[]::text[],
    'admin has no privilege on queue_activity_watermark'
);
SET LOCAL ROLE runrelay_admin;
SELECT lives_ok(f.call, 'an admin calls ' || f.name)
FROM admin_fn AS f
ORDER BY f.name;
SELECT throws_ok($$SELECT 1 FROM runrelay.runs LIMIT 1$$, '42501', NULL, 'an admin cannot read runs directly');
RESET ROLE;
SET LOCAL ROLE runrelay_producer;
SELECT throws_ok(f.call, '42501', NULL, 'a producer cannot call ' || f.name)
FROM admin_fn AS f
ORDER BY f.name;
RESET ROLE;
SET LOCAL ROLE runrelay_worker;
SELECT throws_ok(f.call, '42501', NULL, 'a worker cannot call ' || f.name)
FROM admin_fn AS f
ORDER BY f.name;
RESET ROLE;
SET LOCAL ROLE runrelay_relay;
SELECT throws_ok(f.call, '42501', NULL, 'a relay cannot call ' || f.name)
FROM admin_fn AS f
ORDER BY f.name;
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
