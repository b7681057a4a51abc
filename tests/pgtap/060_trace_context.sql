-- Trace context (docs/operations.md, "Tracing"): a run keeps the W3C trace
-- context of the transaction-local setting runrelay.trace_context
-- (enqueue_run, enqueue_runs) or of an enqueue_runs item's trace_context key;
-- run_trace_context reads it back, in the statement of a claim too; a
-- malformed context raises 22023 naming where it came from and writes
-- nothing; the function's security is the worker's and the relay's.
BEGIN;
SELECT plan(50);

CREATE TEMP TABLE ctx AS
SELECT
    '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "rojo=00f067aa0ba902b7"}'::jsonb
        AS a,
    '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}'::jsonb AS b;
GRANT SELECT ON ctx TO public;

-- The setting, for the rest of the transaction ('' is no context).
CREATE FUNCTION pg_temp.trace(p_value text)
RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('runrelay.trace_context', p_value, TRUE);
$$;

-- enqueue_run under the setting p_value.
CREATE FUNCTION pg_temp.enqueue_traced(p_run_id text, p_value text)
RETURNS SETOF runrelay.enqueue_run_result
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('runrelay.trace_context', p_value, TRUE);
    RETURN QUERY SELECT * FROM runrelay.enqueue_run(p_run_id, queue => 'tq');
END;
$$;

CREATE FUNCTION pg_temp.stored(p_run_id text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT r.trace_context FROM runrelay.runs AS r WHERE r.run_id = p_run_id;
$$;

-- enqueue_run: the setting, or none.
SELECT pg_temp.trace((SELECT a::text FROM ctx));
SELECT is((SELECT created FROM runrelay.enqueue_run('tc-1', queue => 'tq')), TRUE, 'enqueue_run with the setting creates the run');
SELECT is(pg_temp.stored('tc-1'), (SELECT a FROM ctx), 'enqueue_run: the run keeps the setting''s trace context');
SELECT is(runrelay.run_trace_context('tc-1'), (SELECT a FROM ctx), 'run_trace_context reads it back');
SELECT pg_temp.trace((SELECT b::text FROM ctx));
SELECT is((SELECT created FROM runrelay.enqueue_run('tc-1', queue => 'tq')), FALSE, 'a repeat with another context is a repeat');
SELECT is(pg_temp.stored('tc-1'), (SELECT a FROM ctx), 'a repeat keeps the context the run was created with');
SELECT pg_temp.trace('');
SELECT lives_ok($$SELECT * FROM runrelay.enqueue_run('tc-2', queue => 'tq')$$, 'enqueue_run with the setting empty');
SELECT is(pg_temp.stored('tc-2'), NULL, 'an empty setting is no context');
SELECT is(runrelay.run_trace_context('tc-2'), NULL, 'run_trace_context: null for a run without one');
SELECT is(runrelay.run_trace_context('tc-nobody'), NULL, 'run_trace_context: null for an unknown run');
SELECT pg_temp.trace('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": null}');
SELECT lives_ok($$SELECT * FROM runrelay.enqueue_run('tc-3', queue => 'tq')$$, 'a null tracestate is no tracestate');
SELECT pg_temp.trace(jsonb_build_object(
    'traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'tracestate', repeat('k', 512)
)::text);
SELECT lives_ok($$SELECT * FROM runrelay.enqueue_run('tc-4', queue => 'tq')$$, 'a tracestate of 512 characters');

-- enqueue_runs: an item's own key wins; without one, the setting; null: none.
SELECT pg_temp.trace((SELECT a::text FROM ctx));
SELECT results_eq(
    $$SELECT run_id, created FROM runrelay.enqueue_runs(jsonb_build_array(
        jsonb_build_object('run_id', 'tc-b1', 'queue', 'tq'),
        jsonb_build_object('run_id', 'tc-b2', 'queue', 'tq', 'trace_context', (SELECT b FROM ctx)),
        jsonb_build_object('run_id', 'tc-b3', 'queue', 'tq', 'trace_context', NULL)
    ))$$,
    $$VALUES ('tc-b1', TRUE), ('tc-b2', TRUE), ('tc-b3', TRUE)$$,
    'enqueue_runs with per-item trace contexts creates every run'
);
SELECT is(pg_temp.stored('tc-b1'), (SELECT a FROM ctx), 'enqueue_runs: an item without the key gets the setting');
SELECT is(pg_temp.stored('tc-b2'), (SELECT b FROM ctx), 'enqueue_runs: an item''s own trace context wins');
SELECT is(pg_temp.stored('tc-b3'), NULL, 'enqueue_runs: trace_context null is none');
SELECT pg_temp.trace('');
SELECT lives_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "tc-b4", "queue": "tq"}]')$$,
    'enqueue_runs without the setting'
);
SELECT is(pg_temp.stored('tc-b4'), NULL, 'enqueue_runs: no setting, no key: no context');

-- A claim reads its runs' contexts in the same statement.
SELECT results_eq(
    $$SELECT c.run_id, runrelay.run_trace_context(c.run_id)
      FROM runrelay.claim_attempts('tw', ARRAY['tq'], max_runs => 3) AS c ORDER BY c.run_id$$,
    $$SELECT r.run_id, r.trace_context FROM runrelay.runs AS r WHERE r.run_id IN ('tc-1', 'tc-2', 'tc-3')$$,
    'a claim and its runs'' trace contexts in one statement'
);
SELECT is((SELECT trace_context FROM runrelay.get_run('tc-b2')), (SELECT b FROM ctx), 'get_run shows the trace context');

-- A malformed setting: 22023 naming runrelay.trace_context, nothing written.
CREATE TEMP TABLE bad_setting (label text, value text);
INSERT INTO bad_setting VALUES
('not JSON', 'traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'),
('a JSON array', '["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]'),
('JSON null', 'null'),
('no traceparent', '{"tracestate": "a=b"}'),
('a traceparent not a string', '{"traceparent": 1}'),
('an unknown key', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "baggage": "x"}'),
('upper-case hex', '{"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"}'),
('version 01', '{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
('a short trace id', '{"traceparent": "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01"}'),
('an all-zero trace id', '{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}'),
('an all-zero parent id', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"}'),
('a tracestate with a newline', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b\nc=d"}'),
('a tracestate not a string', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": 5}');
INSERT INTO bad_setting VALUES
(
    'a tracestate of 513 characters',
    jsonb_build_object(
        'traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'tracestate', repeat('k', 513)
    )::text
);

SELECT
    throws_ok(
        format($$SELECT * FROM pg_temp.enqueue_traced('tc-bad', %L)$$, s.value),
        '22023', NULL, 'enqueue_run, setting: ' || s.label
    )
FROM bad_setting AS s
ORDER BY s.label;
SELECT pg_temp.trace('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": 1}');
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_run('tc-bad', queue => 'tq')$$,
    'runrelay: invalid runrelay.trace_context: has an unknown key "x"',
    'the error names the setting'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "tc-bad", "queue": "tq", "trace_context": null}]')$$,
    '22023', NULL, 'enqueue_runs checks the setting even if every item has its own context'
);
SELECT pg_temp.trace('');
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'tc-bad%'
    ), 0::bigint,
    'a malformed setting wrote no run'
);

-- A malformed item: 22023 naming items[i].trace_context, the call writes nothing.
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "tc-bad1"}, {"run_id": "tc-bad2", "trace_context": "00-x"}]')$$,
    'runrelay: invalid items[1].trace_context: must be a JSON object (got string)',
    'enqueue_runs: a trace_context that is not an object'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_runs(
        '[{"run_id": "tc-bad1"}, {"run_id": "tc-bad2", "trace_context": {"traceparent": "00-abc"}}]')$$,
    'runrelay: invalid items[1].trace_context: traceparent "00-abc" is not a version-00 W3C traceparent%',
    'enqueue_runs: a malformed traceparent'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs(
        '[{"run_id": "tc-bad1", "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": ["a"]}}]')$$,
    '22023', NULL, 'enqueue_runs: a tracestate that is not a string'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'tc-bad%'
    ), 0::bigint,
    'a malformed item wrote no run, not even the valid items before it'
);
-- Which key is wrong, when the item is not well formed: the string-typed
-- parameter itself, never an integer one.
SELECT throws_like(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": 5, "priority": 1}]')$$,
    'runrelay: invalid items[0].run_id: must be a JSON string (got number)',
    'enqueue_runs: a run_id that is a number is named, not the well-formed priority beside it'
);

-- run_trace_context: bad input.
SELECT throws_ok($$SELECT runrelay.run_trace_context('')$$, '22023', NULL, 'run_trace_context: a blank run_id');
SELECT throws_ok($$SELECT runrelay.run_trace_context(NULL)$$, '22023', NULL, 'run_trace_context: a null run_id');

-- Security: SECURITY DEFINER, VOLATILE, a pinned search_path, a comment;
-- EXECUTE for the worker and the relay only; both call it with no table
-- privilege, the producer and the admin are refused.
SELECT
    ok(
        p.prosecdef AND p.provolatile = 'v'
        AND EXISTS (
            SELECT 1 FROM unnest(p.proconfig) AS c (setting)
            WHERE c.setting LIKE 'search_path=%'
        )
        AND length(obj_description(p.oid, 'pg_proc')) > 0,
        'run_trace_context is SECURITY DEFINER, VOLATILE, pins its search_path and has a COMMENT'
    )
FROM pg_proc AS p
WHERE p.oid = 'runrelay.run_trace_context(text)'::regprocedure;
SELECT is(
    array(
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_proc AS p
        CROSS JOIN LATERAL aclexplode(p.proacl) AS a
        WHERE
            p.oid = 'runrelay.run_trace_context(text)'::regprocedure
            AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        ORDER BY a.grantee::regrole::text
    ),
    ARRAY['runrelay_relay', 'runrelay_worker'],
    'run_trace_context: EXECUTE granted to the relay and the worker only (no PUBLIC)'
);
SET LOCAL ROLE runrelay_worker;
SELECT is(runrelay.run_trace_context('tc-1'), (SELECT a FROM ctx), 'a worker reads a run''s trace context');
SELECT throws_ok($$SELECT r.trace_context FROM runrelay.runs AS r$$, '42501', NULL, 'a worker cannot read runs directly');
RESET ROLE;
SET LOCAL ROLE runrelay_relay;
SELECT is(runrelay.run_trace_context('tc-1'), (SELECT a FROM ctx), 'a relay reads a run''s trace context');
RESET ROLE;
SET LOCAL ROLE runrelay_producer;
SELECT throws_ok($$SELECT runrelay.run_trace_context('tc-1')$$, '42501', NULL, 'a producer cannot call run_trace_context');
RESET ROLE;
SET LOCAL ROLE runrelay_admin;
SELECT throws_ok($$SELECT runrelay.run_trace_context('tc-1')$$, '42501', NULL, 'an admin cannot call run_trace_context');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
