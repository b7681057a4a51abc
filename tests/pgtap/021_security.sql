-- Security of the §3.1 and §3.2 functions and record_step: VOLATILE,
-- SECURITY DEFINER, owned by the schema owner, a pinned search_path, a
-- COMMENT ON FUNCTION; EXECUTE for exactly the role of their section
-- (producer: §3.1, worker: §3.2; relay, admin and PUBLIC: none), and the
-- grants work end to end under SET ROLE.
BEGIN;
SELECT plan(158);

CREATE TEMP TABLE api (name text, args text[], grantee text) ON COMMIT DROP;
INSERT INTO api VALUES
('enqueue_run', ARRAY['text', 'text', 'jsonb', 'timestamptz', 'integer', 'integer', 'text', 'text', 'text'], 'runrelay_producer'),
('signal_run', ARRAY['text', 'text', 'jsonb', 'uuid'], 'runrelay_producer'),
('cancel_run', ARRAY['text', 'text', 'uuid'], 'runrelay_producer'),
('claim_attempts', ARRAY['text', 'text[]', 'integer', 'integer', 'uuid', 'text[]'], 'runrelay_worker'),
('heartbeat', ARRAY['text', 'integer', 'uuid', 'integer'], 'runrelay_worker'),
('record_step', ARRAY['text', 'integer', 'uuid', 'text', 'jsonb'], 'runrelay_worker'),
('complete_attempt', ARRAY['text', 'integer', 'uuid', 'jsonb', 'jsonb'], 'runrelay_worker'),
('complete_attempts', ARRAY['jsonb'], 'runrelay_worker'),
(
    'fail_attempt',
    ARRAY['text', 'integer', 'uuid', 'jsonb', 'timestamptz', 'jsonb', 'boolean', 'boolean'],
    'runrelay_worker'
),
('suspend_attempt', ARRAY['text', 'integer', 'uuid', 'jsonb', 'jsonb'], 'runrelay_worker'),
('release_attempt', ARRAY['text', 'integer', 'uuid', 'timestamptz', 'text'], 'runrelay_worker'),
('prepare_waiting_failure', ARRAY['text', 'integer', 'uuid'], 'runrelay_worker'),
('record_runner_terminal', ARRAY['text', 'integer', 'jsonb'], 'runrelay_worker'),
('claim_detached_terminal', ARRAY['text', 'integer', 'uuid'], 'runrelay_worker'),
('read_runner_terminal', ARRAY['text', 'integer'], 'runrelay_worker'),
('reap_expired', ARRAY['integer'], 'runrelay_worker');

CREATE TEMP VIEW api_proc AS
SELECT
    a.name,
    a.args,
    a.grantee,
    format('runrelay.%I(%s)', a.name, array_to_string(a.args, ', '))::regprocedure AS oid
FROM api AS a;

SELECT is((SELECT count(*) FROM api), 16::bigint, 'the 16 functions of SPEC §3.1, §3.2 and record_step (with release_attempt)');

-- EXECUTE: 16 functions x 4 roles.
SELECT
    function_privs_are(
        'runrelay', a.name, a.args, r.role,
        CASE WHEN r.role = a.grantee THEN ARRAY['EXECUTE'] ELSE ARRAY[]::text[] END,
        format('%s: EXECUTE for %s is %s', a.name, r.role, CASE WHEN r.role = a.grantee THEN 'granted' ELSE 'denied' END)
    )
FROM api AS a
CROSS JOIN
    (VALUES ('runrelay_producer'), ('runrelay_worker'), ('runrelay_relay'), ('runrelay_admin')) AS r (role)
ORDER BY a.name, r.role;

SELECT
    ok(
        NOT bool_or(has_function_privilege('public', p.oid, 'EXECUTE')),
        'PUBLIC cannot execute any of them'
    )
FROM api_proc AS p;

-- Definition properties, per function.
SELECT ok(p.prosecdef, format('%s is SECURITY DEFINER', a.name))
FROM api_proc AS a INNER JOIN pg_catalog.pg_proc AS p ON a.oid = p.oid
ORDER BY a.name;

SELECT
    ok(
        coalesce('search_path=runrelay, pg_temp' = any(p.proconfig), FALSE),
        format('%s pins search_path to runrelay, pg_temp', a.name)
    )
FROM api_proc AS a INNER JOIN pg_catalog.pg_proc AS p ON a.oid = p.oid
ORDER BY a.name;

SELECT
    ok(
        p.proowner = n.nspowner,
        format('%s is owned by the schema owner', a.name)
    )
FROM api_proc AS a
INNER JOIN pg_catalog.pg_proc AS p ON a.oid = p.oid
INNER JOIN pg_catalog.pg_namespace AS n ON p.pronamespace = n.oid
ORDER BY a.name;

SELECT ok(p.provolatile = 'v', format('%s is VOLATILE', a.name))
FROM api_proc AS a INNER JOIN pg_catalog.pg_proc AS p ON a.oid = p.oid
ORDER BY a.name;

SELECT
    ok(
        length(btrim(coalesce(obj_description(a.oid, 'pg_proc'), ''))) > 10,
        format('%s has a COMMENT ON FUNCTION', a.name)
    )
FROM api_proc AS a
ORDER BY a.name;

-- The grants end to end: each role can call its own functions (SECURITY
-- DEFINER writes the tables for it) and is refused the others with 42501.
SET LOCAL ROLE runrelay_producer;
SELECT results_eq(
    $$SELECT * FROM runrelay.enqueue_run('sec-1', 'q-sec')$$,
    $$VALUES ('sec-1', 'queued', TRUE)$$,
    'a producer enqueues through enqueue_run without any table privilege'
);
SELECT is(runrelay.signal_run('sec-1', 'hello'), 'stored', 'a producer signals a run');
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts('w', ARRAY['q-sec'])$$, '42501', NULL, 'a producer cannot claim attempts'
);
SELECT throws_ok($$SELECT * FROM runrelay.reap_expired()$$, '42501', NULL, 'a producer cannot reap');
RESET ROLE;

SET LOCAL ROLE runrelay_worker;
CREATE TEMP TABLE sec_claim AS SELECT * FROM runrelay.claim_attempts('w', ARRAY['q-sec']);
SELECT is((SELECT count(*) FROM sec_claim), 1::bigint, 'a worker claims an attempt');
SELECT is(
    (SELECT runrelay.complete_attempt(run_id, attempt, lease_token) FROM sec_claim), 'completed',
    'a worker completes its attempt'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_run('sec-2', 'q-sec')$$, '42501', NULL, 'a worker cannot enqueue runs'
);
SELECT throws_ok($$SELECT runrelay.cancel_run('sec-1')$$, '42501', NULL, 'a worker cannot cancel runs');
RESET ROLE;

SET LOCAL ROLE runrelay_relay;
SELECT throws_ok($$SELECT * FROM runrelay.enqueue_run('sec-3', 'q-sec')$$, '42501', NULL, 'a relay cannot enqueue runs');
SELECT throws_ok(
    $$SELECT * FROM runrelay.heartbeat('sec-1', 1, gen_random_uuid())$$, '42501', NULL, 'a relay cannot heartbeat'
);
RESET ROLE;

SET LOCAL ROLE runrelay_admin;
SELECT throws_ok($$SELECT runrelay.cancel_run('sec-1')$$, '42501', NULL, 'an admin cannot cancel runs');
SELECT throws_ok($$SELECT * FROM runrelay.reap_expired()$$, '42501', NULL, 'an admin cannot reap');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
