-- enqueue_run's fused path against its general steps.
--
-- A new run without a concurrency key is checked and written by one
-- statement (plpgsql/runs/enqueue_run.sql); every other call takes the steps
-- beside it, which a session with runrelay.reference_paths on takes for
-- every call (_internal/reference_paths.sql). Each case enqueues the same
-- run under the prefixes fast_<case>_ (the fused path where it applies) and
-- ref_<case>_ (the general steps): the answers must be the same, and so must
-- the rows written, normalised as in 027_settle_and_claim.sql, the run's
-- lanes included.
BEGIN;
SELECT plan(25);

-- One enqueue of a case on one side: its answer, normalised, or its error.
CREATE FUNCTION tests.ep_enqueue(p_prefix text, p_call text, p_reference boolean)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_out jsonb;
BEGIN
    PERFORM set_config('runrelay.reference_paths', CASE WHEN p_reference THEN 'on' ELSE '' END, TRUE);
    BEGIN
        EXECUTE format(
            'SELECT jsonb_agg(jsonb_build_array(replace(e.run_id, %L, ''''), e.status, e.created)) FROM %s AS e',
            p_prefix, replace(p_call, '$p', p_prefix)
        ) INTO v_out;
    EXCEPTION WHEN OTHERS THEN
        v_out := jsonb_build_object('error', SQLSTATE, 'message', replace(SQLERRM, p_prefix, ''));
    END;
    PERFORM set_config('runrelay.reference_paths', '', TRUE);
    RETURN v_out;
END;
$$;

-- Both sides of a case: the same answer (and the one expected), the same rows.
CREATE FUNCTION tests.ep_case(p_case text, p_call text, p_expected jsonb)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    v_fast jsonb := tests.ep_enqueue('fast_' || p_case || '_', p_call, FALSE);
    v_ref jsonb := tests.ep_enqueue('ref_' || p_case || '_', p_call, TRUE);
BEGIN
    RETURN NEXT is(v_fast, v_ref, p_case || ': the fused path answers as the general steps');
    RETURN NEXT is(v_fast, p_expected, p_case || ': the expected answer');
    RETURN NEXT is(
        tests.sc_snapshot('fast_' || p_case || '_'),
        tests.sc_snapshot('ref_' || p_case || '_'),
        p_case || ': the same run, event and lane'
    );
END;
$$;

-- new: a new run, every argument given.
SELECT tests.ep_case(
    'new',
    $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', payload => '{"n": 1}', priority => 7,
        max_attempts => 4, payload_retention => 'drop_on_delivery', task => 'mail.send')$$,
    '[["a", "queued", true]]'
);

-- later: not due yet (no wake-up for the workers).
SELECT tests.ep_case(
    'later', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', run_at => '2100-01-01T00:00:00Z')$$,
    '[["a", "queued", true]]'
);

-- traced: the session's trace context is stored with the run.
SELECT set_config(
    'runrelay.trace_context',
    '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
    TRUE
);
SELECT tests.ep_case('traced', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq')$$, '[["a", "queued", true]]');
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs
        WHERE run_id LIKE '%traced_a' AND trace_context IS NOT NULL
    ),
    2::bigint,
    'traced: both sides stored the trace context'
);
SELECT set_config('runrelay.trace_context', '', TRUE);

-- again: the same enqueue twice; the second answers the existing run.
SELECT runrelay.enqueue_run(run_id => p || 'a', queue => p || 'q') FROM (VALUES ('fast_again_'), ('ref_again_')) AS v (p);
SELECT tests.ep_case('again', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq')$$, '[["a", "queued", false]]');

-- conflict: the run_id exists with another payload.
SELECT runrelay.enqueue_run(run_id => p || 'a', queue => p || 'q') FROM (VALUES ('fast_conflict_'), ('ref_conflict_')) AS v (p);
SELECT tests.ep_case(
    'conflict', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', payload => '{"other": 1}')$$,
    '{"error": "22023", "message": "runrelay: invalid run_id: run \"a\" already exists with a different queue or payload (or task)"}'
);

-- invalid: a bad argument is named, nothing written.
SELECT tests.ep_case(
    'invalid', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', max_attempts => 0)$$,
    '{"error": "22023", "message": "runrelay: invalid max_attempts: must be between 1 and 1000 (got 0)"}'
);

-- keyed: a concurrency key takes the general steps on both sides.
SELECT tests.ep_case(
    'keyed', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', concurrency_key => '$pk')$$,
    '[["a", "queued", true]]'
);

-- bad task: an invalid task name is named, nothing written.
SELECT tests.ep_case(
    'bad_task', $$runrelay.enqueue_run(run_id => '$pa', queue => '$pq', task => '')$$,
    '{"error": "22023", "message": "runrelay: invalid task: must be 1 to 200 characters and not blank (got \"\")"}'
);

SELECT * FROM finish();
ROLLBACK;
