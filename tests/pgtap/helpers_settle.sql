-- Fixtures of 027_settle_and_claim.sql (loaded once, after helpers.sql):
-- build a case's state under two prefixes, call settle_and_claim on one and
-- the separate calls on the other, and compare answers and rows normalised.

-- A moment within the hour around now is 'now' (this transaction's clock);
-- the tests pass explicit times far from it when a time matters.
CREATE FUNCTION tests.sc_time(p_time timestamptz)
RETURNS text
LANGUAGE sql
AS $$
    SELECT CASE
        WHEN p_time IS NULL THEN NULL
        WHEN abs(extract(EPOCH FROM p_time - now())) < 3600 THEN 'now'
        ELSE p_time::text
    END;
$$;

-- A JSON value with the prefix removed from every string and a top-level
-- run_at normalised as sc_time does.
CREATE FUNCTION tests.sc_json(p_prefix text, p_value jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT CASE
        WHEN jsonb_typeof(v.value) = 'object' AND v.value ? 'run_at'
            THEN v.value || jsonb_build_object('run_at', tests.sc_time((v.value ->> 'run_at')::timestamptz))
        ELSE v.value
    END
    FROM (SELECT replace(p_value::text, p_prefix, '')::jsonb AS value) AS v;
$$;

-- The ledger lanes of the runs of a prefix: where each lane's head and
-- delivered prefix are, whether it is available, blocked or leased, and to
-- whom (027 and 069 compare them).
CREATE FUNCTION tests.sc_lanes(p_prefix text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_agg(jsonb_build_object(
        'run_id', replace(ll.run_id, p_prefix, ''),
        'lane', ll.lane,
        'head_seq', ll.head_seq,
        'available_at', tests.sc_time(ll.available_at),
        'blocked', ll.blocked,
        'delivered_below', ll.delivered_below,
        'lease_owner', ll.lease_owner,
        'lease_expires_at', tests.sc_time(ll.lease_expires_at),
        'leased_through', ll.leased_through,
        'lease_call', ll.lease_call_id IS NOT NULL,
        'batch', ll.batch_id IS NOT NULL,
        'batch_through', ll.batch_through
    ) ORDER BY ll.run_id, ll.lane)
    FROM runrelay.ledger_lanes AS ll WHERE ll.run_id LIKE p_prefix || '%';
$$;

-- Everything the calls may have written for the runs of a prefix.
CREATE FUNCTION tests.sc_snapshot(p_prefix text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object(
        'runs', (
            SELECT jsonb_agg(jsonb_build_object(
                'run_id', replace(r.run_id, p_prefix, ''),
                'queue', replace(r.queue, p_prefix, ''),
                'status', r.status,
                'key', replace(r.concurrency_key, p_prefix, ''),
                'key_held', r.key_held,
                'run_at', tests.sc_time(r.run_at),
                'attempt_count', r.attempt_count,
                'wait', r.wait,
                'wake_at', tests.sc_time(r.wake_at),
                'resume', r.resume,
                'result', r.result,
                'error', r.error,
                'ledger_seq', r.ledger_seq,
                'finished_at', tests.sc_time(r.finished_at)
            ) ORDER BY r.run_id)
            FROM runrelay.runs AS r WHERE r.run_id LIKE p_prefix || '%'
        ),
        'attempts', (
            SELECT jsonb_agg(jsonb_build_object(
                'run_id', replace(a.run_id, p_prefix, ''),
                'attempt', a.attempt,
                'worker', a.worker,
                'status', a.status,
                'lease_expires_at', tests.sc_time(a.lease_expires_at),
                'runner_result', a.runner_result,
                'error', a.error,
                'finished_at', tests.sc_time(a.finished_at),
                'call_id', a.call_id IS NOT NULL,
                'wait', a.wait,
                'outcome', a.outcome,
                'outcome_op', a.outcome_op,
                'claim_position', a.claim_position
            ) ORDER BY a.run_id, a.attempt)
            FROM runrelay.attempts AS a WHERE a.run_id LIKE p_prefix || '%'
        ),
        'ledger', (
            SELECT jsonb_agg(jsonb_build_object(
                'run_id', replace(l.run_id, p_prefix, ''),
                'lane', l.lane,
                'seq', l.seq,
                'type', l.type,
                'payload', tests.sc_json(p_prefix, l.payload),
                'delivery_key', replace(l.delivery_key, p_prefix, ''),
                'transport_only', l.transport_only,
                'state', l.state
            ) ORDER BY l.run_id, l.lane, l.seq)
            FROM runrelay.ledger AS l WHERE l.run_id LIKE p_prefix || '%'
        ),
        'lanes', tests.sc_lanes(p_prefix),
        'markers', (SELECT count(*) FROM runrelay.cancellations AS c WHERE c.run_id LIKE p_prefix || '%'),
        'signals', (SELECT count(*) FROM runrelay.signals AS s WHERE s.run_id LIKE p_prefix || '%')
    );
$$;

-- The items of a case for one side: each {run, ...} of p_spec becomes
-- {run_id, attempt, lease_token, ...}, fenced with the run's current attempt
-- unless the spec gives attempt or lease_token itself.
CREATE FUNCTION tests.sc_items(p_prefix text, p_spec jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT coalesce(jsonb_agg(
        jsonb_build_object(
            'run_id', p_prefix || (s.item ->> 'run'),
            'attempt', r.attempt_count,
            'lease_token', tests.token(p_prefix || (s.item ->> 'run'), r.attempt_count)
        ) || (s.item - 'run')
        ORDER BY s.ord
    ), '[]'::jsonb)
    FROM jsonb_array_elements(p_spec) WITH ORDINALITY AS s (item, ord)
    LEFT JOIN runrelay.runs AS r ON r.run_id = p_prefix || (s.item ->> 'run');
$$;

-- A row of either side's answer, normalised.
CREATE FUNCTION tests.sc_row(
    p_prefix text, p_kind text, p_run_id text, p_attempt integer, p_outcome text,
    p_lease_token uuid, p_queue text, p_payload jsonb, p_resume jsonb, p_lease_expires_at timestamptz,
    p_task text, p_steps jsonb
)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object(
        'kind', p_kind,
        'run_id', replace(p_run_id, p_prefix, ''),
        'attempt', p_attempt,
        'outcome', p_outcome,
        'token_matches', p_lease_token = tests.token(p_run_id, p_attempt),
        'queue', replace(p_queue, p_prefix, ''),
        'payload', p_payload,
        'resume', p_resume,
        'lease', tests.sc_time(p_lease_expires_at),
        'task', p_task,
        'steps', p_steps
    );
$$;

CREATE FUNCTION tests.sc_queues(p_prefix text, p_queues text[])
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT array_agg(p_prefix || q.name ORDER BY q.ord) FROM unnest(p_queues) WITH ORDINALITY AS q (name, ord);
$$;

-- The fused side: one settle_and_claim call.
CREATE FUNCTION tests.sc_fused(
    p_prefix text, p_spec jsonb, p_queues text[], p_max_runs integer DEFAULT 1, p_call_id uuid DEFAULT NULL,
    p_tasks text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT coalesce(jsonb_agg(
        tests.sc_row(p_prefix, c.kind, c.run_id, c.attempt, c.outcome, c.lease_token, c.queue,
            c.payload, c.resume, c.lease_expires_at, c.task, c.steps)
        ORDER BY c.ord
    ), '[]'::jsonb)
    FROM runrelay.settle_and_claim(
        tests.sc_items(p_prefix, p_spec), 'w1', tests.sc_queues(p_prefix, p_queues), p_max_runs, 30, p_call_id,
        p_tasks
    ) WITH ORDINALITY AS c (
        kind, run_id, attempt, outcome, lease_token, queue, payload, resume, lease_expires_at, task, steps, ord
    );
$$;

-- The split side: each item by its own function, in item order, then a
-- claim, each a statement of its own as a worker's separate calls are.
CREATE FUNCTION tests.sc_split(
    p_prefix text, p_spec jsonb, p_queues text[], p_max_runs integer DEFAULT 1, p_call_id uuid DEFAULT NULL,
    p_tasks text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_item jsonb;
    v_outcome text;
    v_out jsonb := '[]'::jsonb;
    v_claim record;
BEGIN
    FOR v_item IN SELECT i.value FROM jsonb_array_elements(tests.sc_items(p_prefix, p_spec)) AS i (value) LOOP
        CASE coalesce(v_item ->> 'op', 'complete')
            WHEN 'complete' THEN
                v_outcome := runrelay.complete_attempt(
                    run_id => v_item ->> 'run_id',
                    attempt => (v_item ->> 'attempt')::integer,
                    lease_token => (v_item ->> 'lease_token')::uuid,
                    result => coalesce(v_item -> 'result', '{}'),
                    final_events => coalesce(v_item -> 'final_events', '[]')
                );
            WHEN 'fail' THEN
                v_outcome := runrelay.fail_attempt(
                    run_id => v_item ->> 'run_id',
                    attempt => (v_item ->> 'attempt')::integer,
                    lease_token => (v_item ->> 'lease_token')::uuid,
                    error => v_item -> 'error',
                    retry_at => (v_item ->> 'retry_at')::timestamptz,
                    final_events => coalesce(v_item -> 'final_events', '[]')
                );
            WHEN 'suspend' THEN
                v_outcome := runrelay.suspend_attempt(
                    run_id => v_item ->> 'run_id',
                    attempt => (v_item ->> 'attempt')::integer,
                    lease_token => (v_item ->> 'lease_token')::uuid,
                    wait => v_item -> 'wait',
                    final_events => coalesce(v_item -> 'final_events', '[]')
                );
            WHEN 'release' THEN
                v_outcome := runrelay.release_attempt(
                    run_id => v_item ->> 'run_id',
                    attempt => (v_item ->> 'attempt')::integer,
                    lease_token => (v_item ->> 'lease_token')::uuid,
                    run_at => (v_item ->> 'run_at')::timestamptz,
                    reason => v_item ->> 'reason'
                );
        END CASE;
        v_out := v_out || tests.sc_row(p_prefix, 'settled', v_item ->> 'run_id', (v_item ->> 'attempt')::integer,
            v_outcome, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    END LOOP;
    IF p_max_runs > 0 THEN
        FOR v_claim IN
            SELECT * FROM runrelay.claim_attempts(
                'w1', tests.sc_queues(p_prefix, p_queues), p_max_runs, 30, p_call_id, p_tasks
            ) WITH ORDINALITY AS c
        LOOP
            v_out := v_out || tests.sc_row(p_prefix, 'claimed', v_claim.run_id, v_claim.attempt, NULL,
                v_claim.lease_token, v_claim.queue, v_claim.payload, v_claim.resume, v_claim.lease_expires_at,
                v_claim.task, v_claim.steps);
        END LOOP;
    END IF;
    RETURN v_out;
END;
$$;

-- The reference side: the fused call with runrelay.reference_paths on, so
-- that settle_and_claim and _complete take their general steps only, never
-- a fused fast path (_internal/reference_paths.sql).
CREATE FUNCTION tests.sc_reference(
    p_prefix text, p_spec jsonb, p_queues text[], p_max_runs integer DEFAULT 1, p_call_id uuid DEFAULT NULL,
    p_tasks text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_out jsonb;
BEGIN
    PERFORM set_config('runrelay.reference_paths', 'on', TRUE);
    v_out := tests.sc_fused(p_prefix, p_spec, p_queues, p_max_runs, p_call_id, p_tasks);
    PERFORM set_config('runrelay.reference_paths', '', TRUE);
    RETURN v_out;
END;
$$;

-- The three sides of one case: the same answer (and the one expected), and
-- the same rows afterwards.
CREATE FUNCTION tests.sc_case(
    p_case text, p_spec jsonb, p_queues text[], p_expected jsonb, p_max_runs integer DEFAULT 1,
    p_tasks text[] DEFAULT NULL
)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    v_fused jsonb := tests.sc_fused('fused_' || p_case || '_', p_spec, p_queues, p_max_runs, NULL, p_tasks);
    v_split jsonb := tests.sc_split('split_' || p_case || '_', p_spec, p_queues, p_max_runs, NULL, p_tasks);
    v_reference jsonb := tests.sc_reference('ref_' || p_case || '_', p_spec, p_queues, p_max_runs, NULL, p_tasks);
BEGIN
    RETURN NEXT is(v_fused, v_split, p_case || ': the fused call answers as the separate calls');
    RETURN NEXT is(v_fused, v_reference, p_case || ': the fused paths answer as the general steps');
    RETURN NEXT is(
        tests.sc_snapshot('fused_' || p_case || '_'), tests.sc_snapshot('ref_' || p_case || '_'),
        p_case || ': the fused paths leave the rows the general steps leave'
    );
    RETURN NEXT is(
        (SELECT jsonb_agg(jsonb_build_array(r.value ->> 'kind', r.value ->> 'run_id', r.value -> 'attempt', r.value ->> 'outcome'))
         FROM jsonb_array_elements(v_fused) AS r (value)),
        p_expected,
        p_case || ': the expected answer'
    );
    RETURN NEXT is(
        tests.sc_snapshot('fused_' || p_case || '_'), tests.sc_snapshot('split_' || p_case || '_'),
        p_case || ': the same runs, attempts and ledger events'
    );
END;
$$;

-- Set up both sides of a case.
CREATE FUNCTION tests.sc_both(p_case text)
RETURNS SETOF text
LANGUAGE sql
AS $$
    SELECT 'fused_' || p_case || '_'
    UNION ALL SELECT 'split_' || p_case || '_'
    UNION ALL SELECT 'ref_' || p_case || '_';
$$;

-- Deliver every pending lifecycle event of a run (relay 'fixture'), so that
-- its lane has nothing pending and the next event written to it starts the
-- lane again. Raises unless something was delivered.
CREATE FUNCTION tests.sc_deliver(p_run_id text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids bigint[];
    v_acked bigint;
BEGIN
    SELECT array_agg(c.event_id ORDER BY c.seq) INTO v_ids
    FROM runrelay.claim_ledger(relay => 'fixture', run_id => p_run_id, max_events => 100) AS c
    WHERE c.kind = 'claimed';
    SELECT count(*) INTO v_acked
    FROM runrelay.ack_ledger(relay => 'fixture', run_id => p_run_id, event_ids => v_ids) AS a
    WHERE a.kind = 'delivered';
    IF v_acked IS DISTINCT FROM cardinality(v_ids)::bigint OR v_acked = 0 THEN
        RAISE EXCEPTION 'tests.sc_deliver: % of % events of % delivered', v_acked, cardinality(v_ids), p_run_id;
    END IF;
END;
$$;
