-- settle_and_claim(): a worker's continuation in one call and one
-- transaction: settle the attempts it holds, then claim its next runs.
--
-- Without it a worker pays two round trips and two commits per job
-- (complete_attempt, then claim_attempts). The ledger has the same fusion
-- (ack_ledger with claim_next).
--
-- items: [{run_id, attempt, lease_token, op?, ...}, ...], at most 1000, one
-- item per run, where op is
--   complete (the default)  result?, final_events?   as complete_attempt(s)
--   fail                    error, retry_at?, final_events?   as fail_attempt
--   suspend                 wait, final_events?       as suspend_attempt
--   release                 run_at?, reason?          as release_attempt
-- A JSON null is SQL NULL: allowed where the function's parameter defaults
-- to NULL (retry_at, run_at, reason), refused where it is required.
--
-- No rule is decided here. Each item is settled by the public function of
-- its op, so its fence, outcome and replay are exactly that function's: the
-- completions without final_events together by complete_attempts' set-based
-- path, every other item by complete_attempt, fail_attempt, suspend_attempt
-- or release_attempt, one at a time in run_id COLLATE "C" order. The claim
-- is then exactly claim_attempts(worker, queues, max_runs, lease_seconds,
-- call_id); max_runs 0 settles only.
--
-- Result: one 'settled' row per item, in item order (run_id, attempt,
-- outcome); then one 'claimed' row per claimed run, in claim order, with
-- claim_attempts' columns (outcome NULL).
--
-- Replay: a lost reply is resolved by repeating the same call with the same
-- call_id. Each settlement replays through its fence (answers what it
-- answered, writes nothing); the claim replays through call_id (returns the
-- attempts the first call opened, opens nothing). If the first call rolled
-- back, the repeat does the work afresh.
--
-- Locks (custody.sql). Every blocking acquisition comes first and follows
-- the custody order: with more than one item (unless all of them go to
-- complete_attempts, which takes the same locks in the same order), every
-- key lock of the items in lock-id order (_lock_keys), then every item's run
-- row in run_id COLLATE "C" order. The settlements then re-take locks this
-- transaction already holds, which never wait, and attempt rows, which are
-- written only under their run row's lock, so none is held by anyone else;
-- a single item needs no locking ahead, its function takes key, run and
-- attempt in order itself. Ending a keyed run promotes the next run of its
-- key, whose row only a holder of that key lock could hold (custody.sql,
-- "Why keys come first"). The claim comes last and waits for nothing: its
-- candidates and due waits are locked SKIP LOCKED, keys are try-locked, and
-- lanes are taken as every appender takes them. So the call adds no
-- wait-for edge that the separate calls in this order would not.
CREATE TYPE settle_and_claim_result AS (
    kind text,
    run_id text,
    attempt integer,
    outcome text,
    lease_token uuid,
    queue text,
    payload jsonb,
    resume jsonb,
    lease_expires_at timestamptz
);

CREATE FUNCTION settle_and_claim(
    items jsonb,
    worker text,
    queues text[] DEFAULT NULL,
    max_runs integer DEFAULT 1,
    lease_seconds integer DEFAULT 30,
    call_id uuid DEFAULT NULL
)
RETURNS SETOF settle_and_claim_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_hint constant text := 'Pass an array of {run_id, attempt, lease_token, op?, ...} objects, one per run, at most 1000; '
        || 'op complete (result?, final_events?), fail (error, retry_at?, final_events?), '
        || 'suspend (wait, final_events?) or release (run_at?, reason?).';
    v_item jsonb;
    v_index integer := 0;
    v_op text;
    v_fields text[];
    v_run_ids text[] := '{}'::text[];
    v_attempts integer[] := '{}'::integer[];
    v_ops text[] := '{}'::text[];
    v_outcomes text[] := '{}'::text[];
    v_plain jsonb := '[]'::jsonb;
    v_time timestamptz;
    v_field text;
    v_done record;
    v_i integer;
    v_state text;
    v_message text;
    v_column text;
    v_detail_hint text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('worker', settle_and_claim.worker);
    PERFORM _check_int('max_runs', settle_and_claim.max_runs, 0, 1000);
    PERFORM _check_queues(settle_and_claim.queues);
    PERFORM _check_json('items', settle_and_claim.items, 'array');
    IF jsonb_array_length(settle_and_claim.items) > 1000 THEN
        PERFORM _invalid('items', format('has %s items; at most 1000', jsonb_array_length(settle_and_claim.items)), v_hint);
    END IF;

    -- Every item is validated before anything is locked or written. The
    -- checks of an op's own fields are its function's (_normalize_events,
    -- _normalize_wait, _check_time, _check_reason), which name that
    -- function's parameter; the handler below names items instead, with the
    -- item's position, since that is the parameter of this call.
    BEGIN
        FOR v_item IN SELECT i.value FROM jsonb_array_elements(settle_and_claim.items) AS i (value) LOOP
            v_index := v_index + 1;
            IF jsonb_typeof(v_item) <> 'object'
                OR jsonb_typeof(v_item -> 'run_id') IS DISTINCT FROM 'string'
                OR jsonb_typeof(v_item -> 'attempt') IS DISTINCT FROM 'number'
                OR jsonb_typeof(v_item -> 'lease_token') IS DISTINCT FROM 'string' THEN
                PERFORM _invalid('items', format('item %s needs run_id (a string), attempt (a number) and lease_token (a uuid string)', v_index), v_hint);
            END IF;
            IF v_item ? 'op' AND jsonb_typeof(v_item -> 'op') IS DISTINCT FROM 'string' THEN
                PERFORM _invalid('items', format('item %s: op must be a string', v_index), v_hint);
            END IF;
            v_op := coalesce(v_item ->> 'op', 'complete');
            v_fields := CASE v_op
                WHEN 'complete' THEN ARRAY['result', 'final_events']
                WHEN 'fail' THEN ARRAY['error', 'retry_at', 'final_events']
                WHEN 'suspend' THEN ARRAY['wait', 'final_events']
                WHEN 'release' THEN ARRAY['run_at', 'reason']
            END;
            IF v_fields IS NULL THEN
                PERFORM _invalid('items', format('item %s: unknown op %L', v_index, v_op), v_hint);
            END IF;
            IF EXISTS (
                SELECT 1 FROM jsonb_object_keys(v_item) AS k (name)
                WHERE k.name NOT IN ('run_id', 'attempt', 'lease_token', 'op') AND k.name <> ALL(v_fields)
            ) THEN
                PERFORM _invalid('items', format('item %s: a field that a %s item does not take', v_index, v_op), v_hint);
            END IF;
            PERFORM _check_id('run_id', v_item ->> 'run_id');
            IF (v_item ->> 'attempt') !~ '^[0-9]{1,9}$' OR (v_item ->> 'attempt')::integer < 1 THEN
                PERFORM _invalid('items', format('item %s: attempt must be a positive integer', v_index), v_hint);
            END IF;
            IF (v_item ->> 'lease_token') !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
                PERFORM _invalid('items', format('item %s: lease_token is not a uuid', v_index), v_hint);
            END IF;
            IF (v_item ->> 'run_id') = ANY(v_run_ids) THEN
                PERFORM _invalid('items', format('item %s repeats run_id %L', v_index, v_item ->> 'run_id'), v_hint);
            END IF;

            IF v_item ? 'final_events' THEN
                PERFORM _normalize_events('final_events', v_item -> 'final_events', FALSE);
            END IF;
            CASE v_op
                WHEN 'complete' THEN
                    IF jsonb_typeof(v_item -> 'result') = 'null' THEN
                        PERFORM _invalid('items', format('item %s: result must not be null', v_index), v_hint);
                    END IF;
                    -- Completions without final events go to complete_attempts together.
                    IF coalesce(v_item -> 'final_events', '[]'::jsonb) = '[]'::jsonb THEN
                        v_op := 'plain';
                        v_plain := v_plain || jsonb_build_array(v_item - 'op' - 'final_events');
                    END IF;
                WHEN 'fail' THEN
                    IF coalesce(jsonb_typeof(v_item -> 'error'), 'null') = 'null' THEN
                        PERFORM _invalid('items', format('item %s: a fail item needs error', v_index), v_hint);
                    END IF;
                    IF jsonb_typeof(v_item -> 'retry_at') NOT IN ('string', 'null') THEN
                        PERFORM _invalid('items', format('item %s: retry_at must be a timestamp string', v_index), v_hint);
                    END IF;
                    v_field := 'retry_at';
                    v_time := (v_item ->> 'retry_at')::timestamptz;
                    PERFORM _check_time('retry_at', v_time);
                WHEN 'suspend' THEN
                    PERFORM _normalize_wait(v_item -> 'wait');
                ELSE
                    IF jsonb_typeof(v_item -> 'run_at') NOT IN ('string', 'null') THEN
                        PERFORM _invalid('items', format('item %s: run_at must be a timestamp string', v_index), v_hint);
                    END IF;
                    v_field := 'run_at';
                    v_time := (v_item ->> 'run_at')::timestamptz;
                    PERFORM _check_time('run_at', v_time);
                    IF jsonb_typeof(v_item -> 'reason') NOT IN ('string', 'null') THEN
                        PERFORM _invalid('items', format('item %s: reason must be a string', v_index), v_hint);
                    END IF;
                    PERFORM _check_reason('reason', v_item ->> 'reason');
            END CASE;
            v_run_ids := v_run_ids || (v_item ->> 'run_id');
            v_attempts := v_attempts || (v_item ->> 'attempt')::integer;
            v_ops := v_ops || v_op;
        END LOOP;
    EXCEPTION WHEN invalid_parameter_value OR invalid_datetime_format OR datetime_field_overflow THEN
        GET STACKED DIAGNOSTICS
            v_state = RETURNED_SQLSTATE,
            v_message = MESSAGE_TEXT,
            v_column = COLUMN_NAME,
            v_detail_hint = PG_EXCEPTION_HINT;
        IF v_column = 'items' THEN
            RAISE;
        END IF;
        IF v_state <> '22023' THEN
            v_message := format('%s is not a timestamp (%s)', v_field, v_message);
        END IF;
        PERFORM _invalid('items',
            format('item %s: %s', v_index, regexp_replace(v_message, '^runrelay: ', '')),
            coalesce(nullif(v_detail_hint, ''), v_hint));
    END;

    -- A lone completion costs less by complete_attempt than by the batch path.
    IF jsonb_array_length(v_plain) = 1 THEN
        v_ops := array_replace(v_ops, 'plain', 'complete');
        v_plain := '[]'::jsonb;
    END IF;
    IF cardinality(v_run_ids) > 1 AND EXISTS (SELECT 1 FROM unnest(v_ops) AS o (op) WHERE o.op <> 'plain') THEN
        PERFORM _lock_keys(v_run_ids);
        PERFORM 1 FROM runs AS r
        WHERE r.run_id = ANY(v_run_ids)
        ORDER BY r.run_id COLLATE "C"
        FOR NO KEY UPDATE;
    END IF;

    IF jsonb_array_length(v_plain) > 0 THEN
        FOR v_done IN SELECT d.run_id, d.outcome FROM complete_attempts(v_plain) AS d LOOP
            v_outcomes[array_position(v_run_ids, v_done.run_id)] := v_done.outcome;
        END LOOP;
    END IF;
    FOR v_i IN
        SELECT s.i FROM generate_subscripts(v_ops, 1) AS s (i)
        WHERE v_ops[s.i] <> 'plain'
        ORDER BY v_run_ids[s.i] COLLATE "C"
    LOOP
        v_item := settle_and_claim.items -> (v_i - 1);
        CASE v_ops[v_i]
            WHEN 'complete' THEN
                v_outcomes[v_i] := complete_attempt(
                    v_run_ids[v_i], v_attempts[v_i], (v_item ->> 'lease_token')::uuid,
                    coalesce(v_item -> 'result', '{}'::jsonb), coalesce(v_item -> 'final_events', '[]'::jsonb));
            WHEN 'fail' THEN
                v_outcomes[v_i] := fail_attempt(
                    v_run_ids[v_i], v_attempts[v_i], (v_item ->> 'lease_token')::uuid,
                    v_item -> 'error', (v_item ->> 'retry_at')::timestamptz,
                    coalesce(v_item -> 'final_events', '[]'::jsonb));
            WHEN 'suspend' THEN
                v_outcomes[v_i] := suspend_attempt(
                    v_run_ids[v_i], v_attempts[v_i], (v_item ->> 'lease_token')::uuid,
                    v_item -> 'wait', coalesce(v_item -> 'final_events', '[]'::jsonb));
            ELSE
                v_outcomes[v_i] := release_attempt(
                    v_run_ids[v_i], v_attempts[v_i], (v_item ->> 'lease_token')::uuid,
                    (v_item ->> 'run_at')::timestamptz, v_item ->> 'reason');
        END CASE;
    END LOOP;

    RETURN QUERY
    SELECT
        'settled'::text, v_run_ids[s.i], v_attempts[s.i], v_outcomes[s.i],
        NULL::uuid, NULL::text, NULL::jsonb, NULL::jsonb, NULL::timestamptz
    FROM generate_subscripts(v_run_ids, 1) AS s (i)
    ORDER BY s.i;

    IF settle_and_claim.max_runs > 0 THEN
        RETURN QUERY
        SELECT
            'claimed'::text, c.run_id, c.attempt, NULL::text,
            c.lease_token, c.queue, c.payload, c.resume, c.lease_expires_at
        FROM claim_attempts(
            settle_and_claim.worker, settle_and_claim.queues, settle_and_claim.max_runs,
            settle_and_claim.lease_seconds, settle_and_claim.call_id
        ) WITH ORDINALITY AS c (run_id, attempt, lease_token, queue, payload, resume, lease_expires_at, ord)
        ORDER BY c.ord;
    END IF;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION settle_and_claim(jsonb, text, text[], integer, integer, uuid) IS
'Settles attempts (complete, fail, suspend, release; each as its own function decides) and claims the next runs, in one transaction.';
