-- complete_attempts(): the batch form of complete_attempt, one round trip.
--
-- items: [{run_id, attempt, lease_token, result?}, ...], at most 1000, one
-- item per run. Each item is fenced and decided exactly as complete_attempt
-- would, independently of the others. Locks: every key lock of the batch in
-- lock-id order, then the run rows in run_id COLLATE "C" order (then attempt
-- rows, one run at a time), so concurrent batches (and single calls) never
-- deadlock; lanes as every appender takes them, never waiting (custody.sql).
--
-- Set-based: the items that plainly pass the fence (the token matches the
-- run's current, running attempt; no cancel marker; no concurrency key; not a
-- replay) are completed together, a fixed number of statements for the whole
-- batch. Every other item takes complete_attempt's own path (_complete), which
-- answers replays, fence_lost and cancellations and promotes keys.
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
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_item jsonb;
    v_index integer := 0;
    v_run_ids text[] := '{}'::text[];
    v_now timestamptz;
    v_fast text[];
    v_seqs bigint[];
    v_payloads jsonb[];
    v_outcome text;
    v_hint constant text := 'Pass an array of {run_id, attempt, lease_token, result?} objects, one per run, at most 1000.';
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_json('items', complete_attempts.items, 'array');
    IF jsonb_array_length(complete_attempts.items) > 1000 THEN
        PERFORM _invalid('items', format('has %s items; at most 1000', jsonb_array_length(complete_attempts.items)), v_hint);
    END IF;
    FOR v_item IN SELECT i.value FROM jsonb_array_elements(complete_attempts.items) AS i (value) LOOP
        v_index := v_index + 1;
        IF jsonb_typeof(v_item) <> 'object'
            OR jsonb_typeof(v_item -> 'run_id') IS DISTINCT FROM 'string'
            OR jsonb_typeof(v_item -> 'attempt') IS DISTINCT FROM 'number'
            OR jsonb_typeof(v_item -> 'lease_token') IS DISTINCT FROM 'string'
            OR (v_item ? 'result' AND jsonb_typeof(v_item -> 'result') = 'null')
            OR EXISTS (
                SELECT 1 FROM jsonb_object_keys(v_item) AS k (name)
                WHERE k.name NOT IN ('run_id', 'attempt', 'lease_token', 'result')
            ) THEN
            PERFORM _invalid('items', format('item %s is malformed', v_index), v_hint);
        END IF;
        PERFORM _check_id('items', v_item ->> 'run_id');
        IF (v_item ->> 'attempt') !~ '^[0-9]{1,9}$' OR (v_item ->> 'attempt')::integer < 1 THEN
            PERFORM _invalid('items', format('item %s: attempt must be a positive integer', v_index), v_hint);
        END IF;
        IF (v_item ->> 'lease_token') !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
            PERFORM _invalid('items', format('item %s: lease_token is not a uuid', v_index), v_hint);
        END IF;
        IF (v_item ->> 'run_id') = ANY(v_run_ids) THEN
            PERFORM _invalid('items', format('item %s repeats run_id %L', v_index, v_item ->> 'run_id'), v_hint);
        END IF;
        v_run_ids := v_run_ids || (v_item ->> 'run_id');
    END LOOP;
    PERFORM _check_json('items', complete_attempts.items);

    PERFORM _lock_keys(v_run_ids);
    PERFORM 1 FROM runs AS r
    WHERE r.run_id = ANY(v_run_ids)
    ORDER BY r.run_id COLLATE "C"
    FOR NO KEY UPDATE;
    -- No attempt locks: an attempt row is written only under its run's row
    -- lock, so with the runs held the fast items' attempts cannot change, and
    -- the UPDATE below locks them without waiting. _complete, for the other
    -- items, locks its attempt as usual.

    -- A fresh snapshot, taken after the locks: the state and the cancel
    -- markers every fast item is decided on are current.
    v_now := _now();
    WITH fast AS (
        SELECT i.run_id, i.attempt, coalesce(i.result, '{}'::jsonb) AS result
        FROM jsonb_to_recordset(complete_attempts.items)
            AS i (run_id text, attempt integer, lease_token uuid, result jsonb)
        INNER JOIN runs AS r ON i.run_id = r.run_id
        -- One primary-key probe per item (LIMIT keeps the subquery a nested
        -- loop: joined flat, the planner may hash every running attempt).
        CROSS JOIN LATERAL (
            SELECT a.attempt, a.lease_token, a.status, a.outcome_op
            FROM attempts AS a
            WHERE a.run_id = i.run_id AND a.attempt = i.attempt
            LIMIT 1
        ) AS a
        WHERE
            a.lease_token = i.lease_token
            AND a.status = 'running'
            AND a.outcome_op IS NULL
            AND a.attempt = r.attempt_count
            AND r.status = 'running'
            AND r.concurrency_key IS NULL
            -- A scalar subquery, a probe per item (NOT EXISTS may become a
            -- hash anti join over every pending marker).
            AND (SELECT TRUE FROM cancellations AS c WHERE c.run_id = i.run_id) IS NULL
    ),
    attempts_done AS (
        UPDATE attempts AS a
        SET status = 'completed', finished_at = v_now, outcome = 'completed', outcome_op = 'complete'
        FROM fast AS f
        WHERE a.run_id = f.run_id AND a.attempt = f.attempt
    ),
    runs_done AS (
        UPDATE runs AS r
        SET status = 'completed',
            result = f.result,
            wait = NULL,
            wake_at = NULL,
            finished_at = v_now,
            updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        FROM fast AS f
        WHERE r.run_id = f.run_id
        RETURNING r.run_id, r.ledger_seq AS seq, f.attempt, f.result
    )
    SELECT
        array_agg(d.run_id ORDER BY d.run_id COLLATE "C"),
        array_agg(d.seq ORDER BY d.run_id COLLATE "C"),
        array_agg(jsonb_build_object('attempt', d.attempt, 'result', d.result) ORDER BY d.run_id COLLATE "C")
    INTO v_fast, v_seqs, v_payloads
    FROM runs_done AS d;

    PERFORM _emit_lifecycle(v_fast, v_seqs, 'run.completed', v_payloads);
    IF v_fast IS NOT NULL THEN
        -- As _ended, but no marker to drop: none existed when the fast items
        -- were decided. One committed since (cancel_run inserts before it
        -- tries the run lock) lost to this completion and is moot, as it is
        -- after _ended's DELETE; reap_expired sweeps markers of ended runs.
        PERFORM pg_notify(
            'runrelay_terminal',
            json_build_object('run_id', f.run_id, 'status', 'completed')::text
        )
        FROM unnest(v_fast) AS f (run_id);
    END IF;

    FOR v_item IN
        SELECT e.value
        FROM jsonb_array_elements(complete_attempts.items) AS e (value)
        ORDER BY e.value ->> 'run_id' COLLATE "C"
    LOOP
        IF (v_item ->> 'run_id') = ANY(v_fast) THEN
            v_outcome := 'completed';
        ELSE
            v_outcome := _complete(
                v_item ->> 'run_id',
                (v_item ->> 'attempt')::integer,
                (v_item ->> 'lease_token')::uuid,
                coalesce(v_item -> 'result', '{}'::jsonb),
                '[]'::jsonb
            );
        END IF;
        RETURN NEXT (v_item ->> 'run_id', (v_item ->> 'attempt')::integer, v_outcome)::complete_attempts_result;
    END LOOP;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION complete_attempts(jsonb) IS
'Completes a batch of attempts in one round trip, each decided as complete_attempt would, locking in run_id order.';
