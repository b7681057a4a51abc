-- enqueue_runs(): enqueue_run for many runs in one call, set-based.
--
-- items: an array of 1 to 10000 objects whose keys are enqueue_run's
-- parameters, {run_id, queue?, payload?, run_at?, priority?, max_attempts?,
-- payload_retention?, concurrency_key?, task?}, with enqueue_run's defaults for a
-- missing key; a key set to JSON null is that parameter passed as NULL
-- (enqueue_run's rules then apply: run_at null is now, concurrency_key null
-- is no key, anything else null is invalid). One result row per item, in
-- item order: (run_id, status, created), as enqueue_run answers.
--
-- Trace context: an item may also carry trace_context, the W3C trace
-- context its new run keeps (_internal/trace_context.sql; JSON null: none);
-- an item without the key gets the transaction-local setting
-- runrelay.trace_context, as enqueue_run does. A malformed one raises 22023
-- naming items[i].trace_context (or the setting).
--
-- Each item is decided as enqueue_run decides it and the items as
-- sequential enqueue_run calls in item order would be (_enqueue): idempotent
-- on run_id; a run_id repeated in the array is a repeat of its first item
-- (created = false), or 22023 if its queue, task or payload differs; the new runs
-- of one concurrency key are serial in item order. Any invalid item, or an
-- item that names an existing run with another queue or payload, raises
-- 22023 naming items[i].<parameter> (i counts from 0) and the call changes
-- nothing. items over settings.max_payload_bytes as a whole (the byte
-- length of its text) raises 54000 and changes nothing. Emits run.queued per
-- created run; notifies runrelay_runs once per queue with a runnable new run.
--
-- Locks: the row locks of every new run's concurrency key, ascending by
-- key, before anything is written (custody step 1); the new rows are
-- inserted in run_id COLLATE "C" order. Concurrent calls with overlapping
-- keys or run_ids therefore never deadlock. A replay of the whole call is
-- safe: it answers created = false for every item and writes nothing.
CREATE FUNCTION enqueue_runs(items jsonb)
RETURNS SETOF enqueue_runs_result
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
    v_hint constant text := 'Pass an array of 1 to 10000 objects with enqueue_run''s parameters as keys: '
        'run_id, queue, payload, run_at, priority, max_attempts, payload_retention, concurrency_key, task '
        '(and trace_context, a W3C trace context object).';
    v_parameters constant text[] := ARRAY[
        'run_id', 'queue', 'payload', 'run_at', 'priority', 'max_attempts', 'payload_retention', 'concurrency_key',
        'task'
    ];
    v_count integer;
    v_item jsonb;
    v_index integer;
    v_at text;
    v_name text;
    v_casting boolean := FALSE;
    v_run_id text;
    v_queue text;
    v_payload jsonb;
    v_run_at timestamptz;
    v_priority integer;
    v_max_attempts integer;
    v_retention text;
    v_key text;
    v_task text;
    v_trace_context jsonb;
    v_default_trace_context jsonb;
    v_run_ids text[] := '{}'::text[];
    v_queues text[] := '{}'::text[];
    v_payloads jsonb[] := '{}'::jsonb[];
    v_run_ats timestamptz[] := '{}'::timestamptz[];
    v_priorities integer[] := '{}'::integer[];
    v_max_attempts_all integer[] := '{}'::integer[];
    v_retentions text[] := '{}'::text[];
    v_keys text[] := '{}'::text[];
    v_trace_contexts jsonb[] := '{}'::jsonb[];
    v_tasks text[] := '{}'::text[];
    v_now timestamptz;
    v_valid boolean;
    v_max_payload_bytes integer := (SELECT s.max_payload_bytes FROM settings AS s);
BEGIN
    PERFORM _require_read_committed();
    IF enqueue_runs.items IS NULL OR jsonb_typeof(enqueue_runs.items) <> 'array' THEN
        PERFORM _invalid('items',
            format('must be a JSON array (got %s)', coalesce(jsonb_typeof(enqueue_runs.items), 'null')), v_hint);
    END IF;
    v_count := jsonb_array_length(enqueue_runs.items);
    IF v_count < 1 OR v_count > 10000 THEN
        PERFORM _invalid('items', format('must have 1 to 10000 items (got %s)', v_count), v_hint);
    END IF;
    -- The payload cap holds for the call as a whole, not only per payload.
    IF octet_length(enqueue_runs.items::text) > v_max_payload_bytes THEN
        PERFORM _too_large('items', octet_length(enqueue_runs.items::text), v_max_payload_bytes);
    END IF;
    v_now := _now();
    -- One current_setting() when the producer traces nothing.
    IF current_setting('runrelay.trace_context', TRUE) <> '' THEN
        v_default_trace_context := _setting_trace_context();
    END IF;

    -- The common case in one statement: every item well-formed and valid,
    -- its parameters read with enqueue_run's defaults. If any is not (or a
    -- run_at does not cast), the loop below reads the items again one by
    -- one, in order, and raises for the first bad one.
    BEGIN
        SELECT
            bool_and(
                _enqueue_item_well_formed(i.item)
                AND _enqueue_valid(
                    i.run_id, i.queue, i.payload, i.run_at, i.priority, i.max_attempts, i.retention, i.concurrency_key,
                    v_max_payload_bytes
                )
                AND _trace_context_valid(i.trace_context)
                AND (i.task IS NULL OR _id_valid(i.task))
            ),
            array_agg(i.run_id ORDER BY i.n),
            array_agg(i.queue ORDER BY i.n),
            array_agg(i.payload ORDER BY i.n),
            array_agg(i.run_at ORDER BY i.n),
            array_agg(i.priority ORDER BY i.n),
            array_agg(i.max_attempts ORDER BY i.n),
            array_agg(i.retention ORDER BY i.n),
            array_agg(i.concurrency_key ORDER BY i.n),
            array_agg(i.trace_context ORDER BY i.n),
            array_agg(i.task ORDER BY i.n)
        INTO
            v_valid, v_run_ids, v_queues, v_payloads, v_run_ats, v_priorities, v_max_attempts_all, v_retentions, v_keys,
            v_trace_contexts, v_tasks
        FROM (
            SELECT
                e.n,
                e.value AS item,
                e.value ->> 'run_id' AS run_id,
                CASE WHEN e.value ? 'queue' THEN e.value ->> 'queue' ELSE 'default' END AS queue,
                CASE WHEN e.value ? 'payload' THEN nullif(e.value -> 'payload', 'null') ELSE '{}' END AS payload,
                -- enqueue_run's defaults: a missing run_at is now(), a null one the database clock.
                CASE
                    WHEN e.value ? 'run_at' THEN coalesce((e.value ->> 'run_at')::timestamptz, v_now) ELSE now()
                END AS run_at,
                CASE WHEN e.value ? 'priority' THEN (e.value ->> 'priority')::integer ELSE 0 END AS priority,
                CASE WHEN e.value ? 'max_attempts' THEN (e.value ->> 'max_attempts')::integer ELSE 3 END AS max_attempts,
                CASE WHEN e.value ? 'payload_retention' THEN e.value ->> 'payload_retention' ELSE 'keep' END AS retention,
                e.value ->> 'concurrency_key' AS concurrency_key,
                e.value ->> 'task' AS task,
                CASE
                    WHEN e.value ? 'trace_context' THEN nullif(e.value -> 'trace_context', 'null')
                    ELSE v_default_trace_context
                END AS trace_context
            FROM jsonb_array_elements(enqueue_runs.items) WITH ORDINALITY AS e (value, n)
        ) AS i;
    EXCEPTION
        WHEN data_exception THEN
            v_valid := FALSE;
    END;

    IF NOT coalesce(v_valid, FALSE) THEN
        v_run_ids := '{}'::text[];
        v_queues := '{}'::text[];
        v_payloads := '{}'::jsonb[];
        v_run_ats := '{}'::timestamptz[];
        v_priorities := '{}'::integer[];
        v_max_attempts_all := '{}'::integer[];
        v_retentions := '{}'::text[];
        v_keys := '{}'::text[];
        v_trace_contexts := '{}'::jsonb[];
        v_tasks := '{}'::text[];
        BEGIN
            FOR v_item, v_index IN
                SELECT e.value, e.n - 1
                FROM jsonb_array_elements(enqueue_runs.items) WITH ORDINALITY AS e (value, n)
            LOOP
                v_at := 'items[' || v_index || ']';
                IF NOT _enqueue_item_well_formed(v_item) THEN
                    IF jsonb_typeof(v_item) IS DISTINCT FROM 'object' THEN
                        PERFORM _invalid(v_at, format('must be a JSON object (got %s)', jsonb_typeof(v_item)), v_hint);
                    END IF;
                    SELECT min(k.name) INTO v_name
                    FROM jsonb_object_keys(v_item - v_parameters - 'trace_context') AS k (name);
                    IF v_name IS NOT NULL THEN
                        PERFORM _invalid(v_at || '.' || v_name, 'is not a parameter of enqueue_run', v_hint);
                    END IF;
                    SELECT min(p.name) INTO v_name
                    FROM unnest(ARRAY['priority', 'max_attempts']) AS p (name)
                    WHERE jsonb_typeof(v_item -> p.name) NOT IN ('number', 'null');
                    IF v_name IS NOT NULL THEN
                        PERFORM _invalid(v_at || '.' || v_name,
                            format('must be a JSON integer (got %s)', jsonb_typeof(v_item -> v_name)),
                            'Pass an integer.');
                    END IF;
                    SELECT min(p.name) INTO v_name
                    FROM unnest(ARRAY['priority', 'max_attempts']) AS p (name)
                    WHERE jsonb_typeof(v_item -> p.name) = 'number' AND (v_item ->> p.name) !~ '^-?[0-9]{1,9}$';
                    IF v_name IS NOT NULL THEN
                        PERFORM _invalid(v_at || '.' || v_name,
                            format('must be an integer of at most 9 digits (got %s)', _quote(v_item ->> v_name)),
                            'Pass an integer.');
                    END IF;
                    IF jsonb_typeof(v_item -> 'trace_context') NOT IN ('object', 'null') THEN
                        PERFORM _invalid(v_at || '.trace_context',
                            format('must be a JSON object (got %s)', jsonb_typeof(v_item -> 'trace_context')),
                            'Pass a W3C trace context object, or null.');
                    END IF;
                    -- What is left: a parameter whose type is a string.
                    SELECT min(p.name) INTO v_name
                    FROM unnest(ARRAY['run_id', 'queue', 'run_at', 'payload_retention', 'concurrency_key', 'task']) AS p (name)
                    WHERE jsonb_typeof(v_item -> p.name) NOT IN ('string', 'null');
                    PERFORM _invalid(v_at || '.' || v_name,
                        format('must be a JSON string (got %s)', jsonb_typeof(v_item -> v_name)), v_hint);
                END IF;

                v_run_id := v_item ->> 'run_id';
                v_queue := CASE WHEN v_item ? 'queue' THEN v_item ->> 'queue' ELSE 'default' END;
                v_payload := CASE WHEN v_item ? 'payload' THEN nullif(v_item -> 'payload', 'null') ELSE '{}' END;
                v_casting := TRUE;
                -- enqueue_run's defaults: a missing run_at is now(), a null one the database clock.
                v_run_at := CASE WHEN v_item ? 'run_at' THEN coalesce((v_item ->> 'run_at')::timestamptz, v_now) ELSE now() END;
                v_casting := FALSE;
                v_priority := CASE WHEN v_item ? 'priority' THEN (v_item ->> 'priority')::integer ELSE 0 END;
                v_max_attempts := CASE WHEN v_item ? 'max_attempts' THEN (v_item ->> 'max_attempts')::integer ELSE 3 END;
                v_retention := CASE WHEN v_item ? 'payload_retention' THEN v_item ->> 'payload_retention' ELSE 'keep' END;
                v_key := v_item ->> 'concurrency_key';
                v_task := v_item ->> 'task';
                PERFORM _check_enqueue(v_at || '.', v_run_id, v_queue, v_payload, v_run_at, v_priority,
                    v_max_attempts, v_retention, v_key);
                PERFORM _check_id(v_at || '.task', v_task, TRUE);
                v_trace_context := CASE
                    WHEN v_item ? 'trace_context' THEN nullif(v_item -> 'trace_context', 'null')
                    ELSE v_default_trace_context
                END;
                PERFORM _check_trace_context(v_at || '.trace_context', v_trace_context);

                v_run_ids := v_run_ids || v_run_id;
                v_queues := v_queues || v_queue;
                v_payloads := v_payloads || v_payload;
                v_run_ats := v_run_ats || v_run_at;
                v_priorities := v_priorities || v_priority;
                v_max_attempts_all := v_max_attempts_all || v_max_attempts;
                v_retentions := v_retentions || v_retention;
                v_keys := v_keys || v_key;
                v_trace_contexts := v_trace_contexts || v_trace_context;
                v_tasks := v_tasks || v_task;
            END LOOP;
        EXCEPTION
            WHEN data_exception THEN
                -- Only the run_at cast is caught here; every other error passes on.
                IF NOT v_casting THEN
                    RAISE;
                END IF;
                PERFORM _invalid(v_at || '.run_at', format('is not a timestamp (got %s)', _quote(v_item ->> 'run_at')),
                    'Pass a timestamp with time zone in ISO 8601, e.g. 2030-01-01T00:00:00Z.');
        END;
    END IF;

    RETURN QUERY
    SELECT * FROM _enqueue(
        v_run_ids, v_queues, v_payloads, v_run_ats, v_priorities, v_max_attempts_all, v_retentions, v_keys,
        v_trace_contexts, v_tasks, TRUE
    );
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION enqueue_runs(jsonb) IS
'Enqueues many runs in one call, each item decided as enqueue_run would decide it, one result row per item in order.';
