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
-- No rule is decided here. Each item is settled by what settles it in the
-- separate calls, so its fence, outcome and replay are exactly theirs: the
-- completions together by _complete, the routine complete_attempt and
-- complete_attempts run (complete.sql); every other item by fail_attempt,
-- suspend_attempt or release_attempt, one at a time in run_id COLLATE "C"
-- order. The claim is then exactly claim_attempts(worker, queues, max_runs,
-- lease_seconds, call_id, tasks), by the routine claim_attempts runs, _claim
-- (claim.sql); max_runs 0 settles only.
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
-- Cost: the call a worker makes after each job (one completion without
-- final_events, then a claim of at most one run) is checked by one
-- expression, no statement; its completion takes two (_complete's for one
-- item of a run without a key: lock, then decide and write; the key is read
-- and locked first only for a run that has one) and its claim three
-- (_claim: replay, due waits and pauses; the candidate; the start). Other
-- calls whose items are all such completions are checked by one statement
-- and completed by _complete's batch statements. The answer's rows are
-- returned one by one, by no statement. tests/python/test_statements.py
-- pins the counts.
--
-- Locks (custody.sql). Every blocking acquisition comes first and follows
-- the custody order: with more than one item, every key lock of the items
-- in key order (_lock_keys), then (unless every item is a completion:
-- _complete locks its runs in the same order itself) every item's run row
-- in run_id COLLATE "C" order. The settlements then re-take locks this
-- transaction already holds, which never wait, and attempt rows, which are
-- written only under their run row's lock, so none is held by anyone else.
-- A single completion takes its key lock here, as complete_attempt does; any
-- other single item's function takes key, run and attempt in order itself. Ending a keyed run promotes the next run of its
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
    lease_expires_at timestamptz,
    task text,
    steps jsonb
);

CREATE FUNCTION settle_and_claim(
    items jsonb,
    worker text,
    queues text[] DEFAULT NULL,
    max_runs integer DEFAULT 1,
    lease_seconds integer DEFAULT 30,
    call_id uuid DEFAULT NULL,
    tasks text[] DEFAULT NULL
)
RETURNS SETOF settle_and_claim_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_hint constant text := 'Pass an array of {run_id, attempt, lease_token, op?, ...} objects, one per run, at most 1000; '
        || 'op complete (result?, final_events?), fail (error, retry_at?, final_events?), '
        || 'suspend (wait, final_events?) or release (run_at?, reason?).';
    v_plain boolean;
    v_tokens_sorted uuid[];
    v_results_sorted jsonb[];
    v_item jsonb;
    v_index integer := 0;
    v_op text;
    v_fields text[];
    v_run_ids text[] := '{}'::text[];
    v_attempts integer[] := '{}'::integer[];
    v_ops text[] := '{}'::text[];
    v_outcomes text[] := '{}'::text[];
    v_queues text[];
    v_tasks text[];
    v_checked boolean := FALSE;
    v_positions integer[];
    v_ids text[];
    v_numbers integer[];
    v_tokens uuid[];
    v_results jsonb[];
    v_events jsonb[];
    v_settled text[];
    v_time timestamptz;
    v_field text;
    v_i integer;
    v_state text;
    v_message text;
    v_column text;
    v_detail_hint text;
    v_one boolean;
    v_row settle_and_claim_result;
    v_claim claim_attempts_result;
BEGIN
    -- The call a worker makes after each job: one item, a completion without
    -- final_events (run_id, attempt, lease_token, result?, op 'complete'?),
    -- max_runs 0 or 1, the items' text under 1024 bytes (so within the
    -- smallest payload cap, and too short to nest too deep). One expression
    -- checks what the statement below checks of such a call, so it needs no
    -- statement; a call it does not pass goes to that statement. CASE, not
    -- AND: the item's fields are read only once it is an object with them.
    v_one := coalesce(
        CASE
            WHEN
                jsonb_typeof(settle_and_claim.items) = 'array'
                AND jsonb_array_length(settle_and_claim.items) = 1
                AND jsonb_typeof(settle_and_claim.items -> 0) = 'object'
                AND jsonb_typeof(settle_and_claim.items -> 0 -> 'run_id') = 'string'
                AND jsonb_typeof(settle_and_claim.items -> 0 -> 'attempt') = 'number'
                AND jsonb_typeof(settle_and_claim.items -> 0 -> 'lease_token') = 'string'
                THEN
                    _fast_paths()
                    AND current_setting('transaction_isolation') = 'read committed'
                    AND _id_valid(settle_and_claim.worker)
                    AND settle_and_claim.max_runs IN (0, 1)
                    AND octet_length(settle_and_claim.items::text) < 1024
                    AND ((settle_and_claim.items -> 0) - ARRAY['run_id', 'attempt', 'lease_token', 'op', 'result'])
                    = '{}'::jsonb
                    AND coalesce(settle_and_claim.items -> 0 -> 'op', '"complete"'::jsonb) = '"complete"'::jsonb
                    AND jsonb_typeof(settle_and_claim.items -> 0 -> 'result') IS DISTINCT FROM 'null'
                    AND _id_valid(settle_and_claim.items -> 0 ->> 'run_id')
                    AND (settle_and_claim.items -> 0 ->> 'attempt') ~ '^[0-9]{1,9}$'
                    AND (settle_and_claim.items -> 0 ->> 'attempt') ~ '[1-9]'
                    AND (settle_and_claim.items -> 0 ->> 'lease_token')
                    ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
        END,
        FALSE
    );
    IF v_one THEN
        v_plain := TRUE;
        v_run_ids := ARRAY[settle_and_claim.items -> 0 ->> 'run_id'];
        v_attempts := ARRAY[(settle_and_claim.items -> 0 ->> 'attempt')::integer];
        v_tokens := ARRAY[(settle_and_claim.items -> 0 ->> 'lease_token')::uuid];
        v_results := ARRAY[coalesce(settle_and_claim.items -> 0 -> 'result', '{}'::jsonb)];
    END IF;

    -- Any other call whose items are all completions with no final_events
    -- (run_id, attempt, lease_token, result?, op 'complete'?) of runs
    -- without a concurrency key. One statement checks everything the
    -- checks below would check of such a call (isolation, worker, max_runs,
    -- the items' size, nesting and fields, no repeated run) and reads the
    -- items into arrays, in item order and in the lock order; a key is read
    -- without a lock, as _lock_keys reads it (a run's key never changes).
    -- Such a call needs no key lock and no run lock ahead of _complete (the
    -- custody order below takes neither for keyless completions), so it goes
    -- straight to _complete. Any other call, valid or not, takes the path
    -- below, whose checks name what is wrong.
    IF NOT v_one THEN
        SELECT
            coalesce(
                _fast_paths()
                AND current_setting('transaction_isolation') = 'read committed'
                AND _id_valid(settle_and_claim.worker)
                AND settle_and_claim.max_runs BETWEEN 0 AND 1000
                AND jsonb_typeof(settle_and_claim.items) = 'array'
                AND count(*) <= 1000
                AND bool_and(e.plain AND e.attempt >= 1) IS NOT FALSE
                AND (
                    SELECT octet_length(settle_and_claim.items::text) <= s.max_payload_bytes
                    FROM settings AS s
                )
                AND (
                    octet_length(settle_and_claim.items::text) < 1024
                    OR NOT jsonb_path_exists(settle_and_claim.items, 'strict $.**{512}')
                ),
                FALSE
            ),
            -- In item order: the rows come in it (no aggregate sorts its own).
            coalesce(array_agg(e.run_id), '{}'::text[]),
            coalesce(array_agg(e.attempt), '{}'::integer[]),
            array_agg(e.token),
            array_agg(e.result)
        INTO v_plain, v_run_ids, v_attempts, v_tokens, v_results
        FROM (
            SELECT
                x.i, x.item ->> 'run_id' AS run_id, x.plain,
                CASE WHEN x.plain THEN (x.item ->> 'attempt')::integer END AS attempt,
                CASE WHEN x.plain THEN (x.item ->> 'lease_token')::uuid END AS token,
                coalesce(x.item -> 'result', '{}'::jsonb) AS result
            FROM (
                SELECT
                    e.i, e.item,
                    -- CASE, not AND: the later tests may be evaluated only on an
                    -- object with string fields.
                    CASE
                        WHEN
                            jsonb_typeof(e.item) = 'object'
                            AND jsonb_typeof(e.item -> 'run_id') = 'string'
                            AND jsonb_typeof(e.item -> 'attempt') = 'number'
                            AND jsonb_typeof(e.item -> 'lease_token') = 'string'
                            THEN
                                (e.item - ARRAY['run_id', 'attempt', 'lease_token', 'op', 'result']) = '{}'::jsonb
                                AND coalesce(e.item -> 'op', '"complete"'::jsonb) = '"complete"'::jsonb
                                AND jsonb_typeof(e.item -> 'result') IS DISTINCT FROM 'null'
                                AND _id_valid(e.item ->> 'run_id')
                                AND (e.item ->> 'attempt') ~ '^[0-9]{1,9}$'
                                AND (e.item ->> 'lease_token')
                                ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
                                AND (
                                    SELECT r.concurrency_key FROM runs AS r
                                    WHERE r.run_id = e.item ->> 'run_id'
                                    LIMIT 1
                                ) IS NULL
                        ELSE FALSE
                    END AS plain
                FROM jsonb_array_elements(
                    CASE WHEN jsonb_typeof(settle_and_claim.items) = 'array' THEN settle_and_claim.items END
                ) WITH ORDINALITY AS e (item, i)
            ) AS x
            ORDER BY x.i  -- the order of the function's rows: no sort
        ) AS e;
    END IF;

    -- Several items: no run repeated, and the lock order (one item is in it).
    IF v_plain AND cardinality(v_run_ids) > 1 THEN
        SELECT
            count(DISTINCT v_run_ids[s.i]) = count(*),
            array_agg(s.i ORDER BY v_run_ids[s.i] COLLATE "C")
        INTO v_plain, v_positions
        FROM generate_subscripts(v_run_ids, 1) AS s (i);
    ELSE
        v_positions := ARRAY[1];
    END IF;

    IF v_plain THEN
        v_queues := _check_names('queues', settle_and_claim.queues, 'queue');
        v_tasks := _check_names('tasks', settle_and_claim.tasks, 'task');
        IF cardinality(v_run_ids) > 0 THEN
            v_ids := '{}'::text[];
            v_numbers := '{}'::integer[];
            v_tokens_sorted := '{}'::uuid[];
            v_results_sorted := '{}'::jsonb[];
            FOREACH v_i IN ARRAY v_positions LOOP
                v_ids := v_ids || v_run_ids[v_i];
                v_numbers := v_numbers || v_attempts[v_i];
                v_tokens_sorted := v_tokens_sorted || v_tokens[v_i];
                v_results_sorted := v_results_sorted || v_results[v_i];
            END LOOP;
            -- The one item's key was not read: _complete completes it if its
            -- run has no key; otherwise it locked and wrote nothing, and the
            -- key lock comes first (custody step 1), as for any lone
            -- completion.
            IF v_one THEN
                v_settled := _complete(v_ids, v_numbers, v_tokens_sorted, v_results_sorted, ARRAY['[]'::jsonb], FALSE);
                IF v_settled IS NULL THEN
                    PERFORM _lock_key_of(v_ids[1]);
                END IF;
            END IF;
            IF v_settled IS NULL THEN
                v_settled := _complete(
                    v_ids, v_numbers, v_tokens_sorted, v_results_sorted,
                    array_fill('[]'::jsonb, ARRAY[cardinality(v_ids)])
                );
            END IF;
            FOR v_i IN 1 .. cardinality(v_positions) LOOP
                v_outcomes[v_positions[v_i]] := v_settled[v_i];
            END LOOP;
        END IF;
    ELSE
        v_run_ids := '{}'::text[];
        v_attempts := '{}'::integer[];
        PERFORM _require_read_committed();
        PERFORM _check_id('worker', settle_and_claim.worker);
        PERFORM _check_int('max_runs', settle_and_claim.max_runs, 0, 1000);
        v_queues := _check_names('queues', settle_and_claim.queues, 'queue');
        v_tasks := _check_names('tasks', settle_and_claim.tasks, 'task');
        PERFORM _check_json('items', settle_and_claim.items, 'array');
        IF jsonb_array_length(settle_and_claim.items) > 1000 THEN
            PERFORM _invalid('items', format('has %s items; at most 1000', jsonb_array_length(settle_and_claim.items)), v_hint);
        END IF;

        -- Every item is validated before anything is locked or written: first
        -- what every item names (_check_item) and the shape of its op.
        FOR v_item IN SELECT i.value FROM jsonb_array_elements(settle_and_claim.items) AS i (value) LOOP
            v_index := v_index + 1;
            PERFORM _check_item('items', v_index, v_item, v_run_ids, v_hint);
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
                PERFORM _invalid('items', format('item %s: unknown op %s', v_index, _quote(v_op)), v_hint);
            END IF;
            IF EXISTS (
                SELECT 1 FROM jsonb_object_keys(v_item) AS k (name)
                WHERE k.name NOT IN ('run_id', 'attempt', 'lease_token', 'op') AND k.name <> ALL(v_fields)
            ) THEN
                PERFORM _invalid('items', format('item %s: a field that a %s item does not take', v_index, v_op), v_hint);
            END IF;
            IF v_op = 'complete' AND jsonb_typeof(v_item -> 'result') = 'null' THEN
                PERFORM _invalid('items', format('item %s: result must not be null', v_index), v_hint);
            END IF;
            v_run_ids := v_run_ids || (v_item ->> 'run_id');
            v_attempts := v_attempts || (v_item ->> 'attempt')::integer;
            v_ops := v_ops || v_op;
            -- A completion without final_events has no field left to check.
            v_checked := v_checked OR v_op <> 'complete' OR v_item ? 'final_events';
        END LOOP;

        -- Then the op's own fields, by the checks of the op's function
        -- (_normalize_events, _normalize_wait, _check_time, _check_reason), which
        -- name that function's parameter; the handler names items instead, with
        -- the item's position, since that is the parameter of this call. (A block
        -- with a handler costs a subtransaction, so only when there is a field.)
        IF v_checked THEN
            BEGIN
                FOR v_i IN 1 .. cardinality(v_run_ids) LOOP
                    v_index := v_i;  -- the handler names the item by it
                    v_item := settle_and_claim.items -> (v_i - 1);
                    IF v_item ? 'final_events' THEN
                        PERFORM _normalize_events('final_events', v_item -> 'final_events', FALSE);
                    END IF;
                    CASE v_ops[v_i]
                        WHEN 'complete' THEN
                            NULL;
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
                    -- The cast's own message would repeat the value whole.
                    v_message := format('%s is not a timestamp (got %s)', v_field,
                        _quote(settle_and_claim.items -> (v_index - 1) ->> v_field));
                END IF;
                PERFORM _invalid('items',
                    format('item %s: %s', v_index, regexp_replace(v_message, '^runrelay: ', '')),
                    coalesce(nullif(v_detail_hint, ''), v_hint));
            END;
        END IF;

        -- Locks, in the custody order: every key lock first; with an item other
        -- than a completion among several, every run row too, in run_id
        -- COLLATE "C" order (the completions' routine locks its runs in that
        -- order itself, and a lone item's function takes its own).
        IF cardinality(v_run_ids) > 1 THEN
            PERFORM _lock_keys(v_run_ids);
            IF 'complete' <> ANY(v_ops) THEN
                PERFORM 1 FROM runs AS r
                WHERE r.run_id = ANY(v_run_ids)
                ORDER BY r.run_id COLLATE "C"
                FOR NO KEY UPDATE;
            END IF;
        ELSIF v_ops[1] = 'complete' THEN
            PERFORM _lock_key_of(v_run_ids[1]);
        END IF;

        -- The completions together, by the one completion routine (what
        -- complete_attempt and complete_attempts run), in run_id order.
        SELECT
            array_agg(s.i ORDER BY v_run_ids[s.i] COLLATE "C"),
            array_agg(v_run_ids[s.i] ORDER BY v_run_ids[s.i] COLLATE "C"),
            array_agg(v_attempts[s.i] ORDER BY v_run_ids[s.i] COLLATE "C"),
            array_agg((settle_and_claim.items -> (s.i - 1) ->> 'lease_token')::uuid ORDER BY v_run_ids[s.i] COLLATE "C"),
            array_agg(coalesce(settle_and_claim.items -> (s.i - 1) -> 'result', '{}'::jsonb) ORDER BY v_run_ids[s.i] COLLATE "C"),
            array_agg(
                _normalize_events('final_events', coalesce(settle_and_claim.items -> (s.i - 1) -> 'final_events', '[]'::jsonb), FALSE)
                ORDER BY v_run_ids[s.i] COLLATE "C"
            )
        INTO v_positions, v_ids, v_numbers, v_tokens, v_results, v_events
        FROM generate_subscripts(v_ops, 1) AS s (i)
        WHERE v_ops[s.i] = 'complete';
        IF v_positions IS NOT NULL THEN
            v_settled := _complete(v_ids, v_numbers, v_tokens, v_results, v_events);
            FOR v_i IN 1 .. cardinality(v_positions) LOOP
                v_outcomes[v_positions[v_i]] := v_settled[v_i];
            END LOOP;
        END IF;

        -- Every other item by its own function, in run_id order.
        FOR v_i IN
            SELECT s.i FROM generate_subscripts(v_ops, 1) AS s (i)
            WHERE v_ops[s.i] <> 'complete'
            ORDER BY v_run_ids[s.i] COLLATE "C"
        LOOP
            v_item := settle_and_claim.items -> (v_i - 1);
            CASE v_ops[v_i]
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
    END IF;

    -- The settled rows, in item order, then the claim's, in claim order: the
    -- claim runs here, after every settlement. Row by row, by no statement.
    FOR v_i IN 1 .. cardinality(v_run_ids) LOOP
        v_row := ('settled', v_run_ids[v_i], v_attempts[v_i], v_outcomes[v_i], NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        RETURN NEXT v_row;
    END LOOP;
    IF settle_and_claim.max_runs > 0 THEN
        FOREACH v_claim IN ARRAY _claim(
            settle_and_claim.worker, v_queues, v_tasks, settle_and_claim.max_runs,
            _lease(settle_and_claim.lease_seconds), settle_and_claim.call_id
        ) LOOP
            v_row := (
                'claimed', v_claim.run_id, v_claim.attempt, NULL, v_claim.lease_token, v_claim.queue, v_claim.payload,
                v_claim.resume, v_claim.lease_expires_at, v_claim.task, v_claim.steps
            );
            RETURN NEXT v_row;
        END LOOP;
    END IF;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION settle_and_claim(jsonb, text, text[], integer, integer, uuid, text[]) IS
'Settles attempts (complete, fail, suspend, release; each as its own function decides) and claims the next runs, in one transaction.';
