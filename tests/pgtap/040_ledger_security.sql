-- Ledger privileges (SPEC §5): every ledger function is SECURITY DEFINER
-- with a pinned search_path and a COMMENT; EXECUTE is granted exactly to the
-- role of its SPEC section (producer: append_events; relay: claim, ack, renew,
-- release, fail, next_due_at; admin: requeue, prune and the stats views) and
-- to nobody else, PUBLIC included.
BEGIN;
SELECT plan(74);

CREATE TEMPORARY TABLE ledger_fn (name text, owner_role text) ON COMMIT DROP;
INSERT INTO ledger_fn VALUES
('append_events', 'runrelay_producer'),
('claim_ledger', 'runrelay_relay'),
('ack_ledger', 'runrelay_relay'),
('renew_ledger_lease', 'runrelay_relay'),
('release_ledger', 'runrelay_relay'),
('fail_ledger', 'runrelay_relay'),
('ledger_next_due_at', 'runrelay_relay'),
('requeue_ledger_event', 'runrelay_admin'),
('prune', 'runrelay_admin');

SELECT is(
    (
        SELECT count(*) FROM pg_proc AS p INNER JOIN ledger_fn AS f ON p.proname = f.name
        WHERE p.pronamespace = 'runrelay'::regnamespace
    ),
    9::bigint,
    'each ledger function exists exactly once (no stray overloads)'
);

-- Each ledger function with its catalog row.
CREATE TEMPORARY VIEW ledger_proc AS
SELECT
    f.name,
    f.owner_role,
    p.oid,
    p.prosecdef,
    p.proacl,
    p.proowner
FROM ledger_fn AS f
INNER JOIN pg_proc AS p ON f.name = p.proname AND p.pronamespace = 'runrelay'::regnamespace;

-- SECURITY DEFINER, pinned search_path, comment: one assertion per function.
SELECT ok(p.prosecdef, p.name || ' is SECURITY DEFINER')
FROM ledger_proc AS p
ORDER BY p.name;
SELECT ok(tests.pins_search_path(p.oid), p.name || ' pins its search_path')
FROM ledger_proc AS p
ORDER BY p.name;
SELECT ok(coalesce(length(obj_description(p.oid, 'pg_proc')), 0) > 0, p.name || ' has a COMMENT ON FUNCTION')
FROM ledger_proc AS p
ORDER BY p.name;

-- EXECUTE: exactly the SPEC role of each function; nobody else.
SELECT
    is(
        array(
            SELECT r.rolname FROM pg_roles AS r
            WHERE
                r.rolname IN ('runrelay_producer', 'runrelay_worker', 'runrelay_relay', 'runrelay_admin')
                AND has_function_privilege(r.rolname, p.oid, 'EXECUTE')
            ORDER BY r.rolname
        ),
        ARRAY[p.owner_role]::name[],
        p.name || ': EXECUTE granted to ' || p.owner_role || ' only'
    )
FROM ledger_proc AS p
ORDER BY p.name;
SELECT
    ok(
        NOT EXISTS (
            SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'
        ),
        p.name || ': no EXECUTE for PUBLIC'
    )
FROM ledger_proc AS p
ORDER BY p.name;
SELECT is(tests.execute_grantees(p.oid), ARRAY[p.owner_role], p.name || ': the ACL names no other grantee')
FROM ledger_proc AS p
ORDER BY p.name;

-- The views: SELECT for the admin role only.
SELECT table_privs_are('runrelay', 'run_stats', 'runrelay_admin', ARRAY['SELECT'], 'admin may SELECT run_stats');
SELECT table_privs_are('runrelay', 'ledger_stats', 'runrelay_admin', ARRAY['SELECT'], 'admin may SELECT ledger_stats');
SELECT table_privs_are('runrelay', 'run_stats', 'runrelay_relay', ARRAY[]::text[], 'relay has no privilege on run_stats');
SELECT table_privs_are('runrelay', 'ledger_stats', 'runrelay_relay', ARRAY[]::text[], 'relay has no privilege on ledger_stats');
SELECT table_privs_are('runrelay', 'ledger_stats', 'runrelay_producer', ARRAY[]::text[], 'producer has no privilege on ledger_stats');
SELECT table_privs_are('runrelay', 'ledger_stats', 'runrelay_worker', ARRAY[]::text[], 'worker has no privilege on ledger_stats');
SELECT table_privs_are('runrelay', 'ledger_stats', 'public', ARRAY[]::text[], 'PUBLIC has no privilege on ledger_stats');
SELECT table_privs_are('runrelay', 'run_stats', 'public', ARRAY[]::text[], 'PUBLIC has no privilege on run_stats');
SELECT table_privs_are('runrelay', 'ledger_lanes', 'runrelay_relay', ARRAY[]::text[], 'relay has no privilege on ledger_lanes');

-- Switching roles: the grants work through SECURITY DEFINER, and only them.
SELECT runrelay.enqueue_run('sec');
SET LOCAL ROLE runrelay_producer;
SELECT lives_ok($$SELECT runrelay.append_events('sec', '[{"type": "a"}]')$$, 'a producer appends events');
SELECT throws_ok($$SELECT * FROM runrelay.claim_ledger(relay => 'x')$$, '42501', NULL, 'a producer cannot claim ledger events');
RESET ROLE;
SET LOCAL ROLE runrelay_relay;
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 'sec')$$,
    $$VALUES ('claimed', 'run.queued')$$,
    'a relay claims through claim_ledger without any table privilege'
);
SELECT throws_ok($$SELECT runrelay.append_events('sec', '[{"type": "b"}]')$$, '42501', NULL, 'a relay cannot append events');
SELECT throws_ok($$SELECT runrelay.prune(now())$$, '42501', NULL, 'a relay cannot prune');
SELECT throws_ok($$SELECT runrelay.requeue_ledger_event(1)$$, '42501', NULL, 'a relay cannot requeue');
SELECT throws_ok($$UPDATE runrelay.ledger_events SET delivered_at = now()$$, '42501', NULL, 'a relay cannot write the ledger directly');
RESET ROLE;
SET LOCAL ROLE runrelay_worker;
SELECT throws_ok(
    $$SELECT * FROM runrelay.ack_ledger('x', 'sec', '{1}')$$, '42501', NULL, 'a worker cannot acknowledge ledger events'
);
RESET ROLE;
SET LOCAL ROLE runrelay_admin;
SELECT lives_ok($$SELECT runrelay.prune(now() - interval '1 day')$$, 'an admin prunes');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x')$$, '42501', NULL, 'an admin cannot claim ledger events'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
