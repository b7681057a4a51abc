-- complete_attempts(): the batch form of complete_attempt, one round trip.
--
-- items: [{run_id, attempt, lease_token, result?}, ...], at most 1000, one
-- item per run. Each item is fenced and decided exactly as complete_attempt
-- would, independently of the others. Locks: every key lock of the batch in
-- key order, then the run rows in run_id COLLATE "C" order, so
-- concurrent batches (and single calls) never deadlock; lanes as every
-- appender takes them, never waiting (custody.sql).
--
-- Set-based: _complete, the routine complete_attempt uses for its one item,
-- decides and completes the whole batch in a fixed number of statements
-- (one item at a time only to apply a cancel marker). Answers in run_id
-- COLLATE "C" order.
CREATE TYPE complete_attempts_result AS (
    run_id text,
    attempt integer,
    outcome text
);

CREATE FUNCTION complete_attempts(items jsonb)
RETURNS SETOF complete_attempts_result
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
    v_item jsonb;
    v_index integer := 0;
    v_run_ids text[] := '{}'::text[];
    v_attempts integer[];
    v_tokens uuid[];
    v_results jsonb[];
    v_outcomes text[];
    v_hint constant text := 'Pass an array of {run_id, attempt, lease_token, result?} objects, one per run, at most 1000.';
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_json('items', complete_attempts.items, 'array');
    IF jsonb_array_length(complete_attempts.items) > 1000 THEN
        PERFORM _invalid('items', format('has %s items; at most 1000', jsonb_array_length(complete_attempts.items)), v_hint);
    END IF;
    FOR v_item IN SELECT i.value FROM jsonb_array_elements(complete_attempts.items) AS i (value) LOOP
        v_index := v_index + 1;
        PERFORM _check_item('items', v_index, v_item, v_run_ids, v_hint);
        IF (v_item ? 'result' AND jsonb_typeof(v_item -> 'result') = 'null')
            OR EXISTS (
                SELECT 1 FROM jsonb_object_keys(v_item) AS k (name)
                WHERE k.name NOT IN ('run_id', 'attempt', 'lease_token', 'result')
            ) THEN
            PERFORM _invalid('items', format('item %s is malformed', v_index), v_hint);
        END IF;
        v_run_ids := v_run_ids || (v_item ->> 'run_id');
    END LOOP;
    PERFORM _check_json('items', complete_attempts.items);

    IF cardinality(v_run_ids) = 0 THEN
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;
    PERFORM _lock_keys(v_run_ids);
    -- The items in the lock order; _complete decides and writes them all.
    SELECT
        array_agg(i.run_id ORDER BY i.run_id COLLATE "C"),
        array_agg(i.attempt ORDER BY i.run_id COLLATE "C"),
        array_agg(i.lease_token ORDER BY i.run_id COLLATE "C"),
        array_agg(coalesce(i.result, '{}'::jsonb) ORDER BY i.run_id COLLATE "C")
    INTO v_run_ids, v_attempts, v_tokens, v_results
    FROM jsonb_to_recordset(complete_attempts.items)
        AS i (run_id text, attempt integer, lease_token uuid, result jsonb);
    v_outcomes := _complete(
        v_run_ids, v_attempts, v_tokens, v_results,
        array_fill('[]'::jsonb, ARRAY[cardinality(v_run_ids)])
    );
    RETURN QUERY
    SELECT v_run_ids[g.i], v_attempts[g.i], v_outcomes[g.i]
    FROM generate_subscripts(v_run_ids, 1) AS g (i)
    ORDER BY g.i;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION complete_attempts(jsonb) IS
'Completes a batch of attempts in one round trip, each decided as complete_attempt would, locking in run_id order.';
