-- _complete(): the one routine that completes runs. complete_attempt is a
-- one-item use of it, complete_attempts (and settle_and_claim, through
-- them) a batch, so the fence, the cancel marker, final_events and the
-- terminal write of a completion are decided and written here only.
--
-- The items are parallel arrays, one item per run, validated by the caller
-- (final_events normalised, results not null) and given in the lock order,
-- run_id COLLATE "C". Arrays, not a jsonb list or a set-returning function:
-- a single completion pays for neither parsing nor a tuplestore.
-- Precondition: the caller holds the key locks of the items (custody step 1),
-- unless it passes p_keys_locked false for a lone item whose run's key it has
-- not read: then _complete completes the item by the one-item statements
-- below if its run has no key, and otherwise returns NULL having locked and
-- written nothing, so that the caller takes the key lock and calls again
-- (settle_and_claim and complete_attempt save the key's look that way).
--
-- Steps, each one statement for the whole batch:
--   1. lock the run rows, in the given order, waiting (the caller bounds the
--      wait), reading what the fence needs of them and where each row is.
--      Attempt rows are written only under their run's row lock, so with
--      the runs held they cannot change: the UPDATE of step 4 locks them
--      without waiting, and no step locks them ahead;
--   2. decide every item in a fresh snapshot: the fence (_fence_of: fence_lost,
--      cancelled, or a replay's recorded outcome) and whether a cancel marker
--      is pending;
--   3. one item at a time, only where needed: a pending marker is applied
--      (cancelled); final_events are appended ahead of run.completed;
--   4. the items that passed are completed together: one statement for
--      their attempts and their runs, one lifecycle write of run.completed,
--      then the end-of-run bookkeeping (_ended).
-- The common batch (no final_events, no run with a concurrency key) takes
-- steps 2 to 4 in one statement that writes all its items or none; a batch
-- it cannot complete whole goes through the steps one by one (below). A
-- single such item (a worker's completion of the job it ran: every
-- complete_attempt, and settle_and_claim's call after each job) has
-- statements of its own, scalar ones: no item list, no aggregate to build.
-- The same steps, the same rows; runrelay.reference_paths turns both short
-- cuts off (tests/pgtap/027_settle_and_claim.sql holds them to the steps).
-- Each row is found once, by a primary-key probe (LATERAL ... LIMIT 1, so
-- the plan is a probe whatever the statistics say: joined by key against the
-- item list, a young install's plan could read the whole table), and updated
-- where it was found (by ctid), not looked up again.
--
-- enable_seqscan is off for the routine's statements. A worker's session
-- makes its generic plans early, often while attempts is nearly empty (a new
-- install; a bench that loads runs and starts at once), and keeps them until
-- an ANALYZE: planned on 40 attempts, the UPDATE of step 4 hashed a scan of
-- the whole table, and step 2's probes read it too, for every batch, as it
-- grew to thousands of rows. With no sequential scan to choose, every
-- statement here is the probe it is written as, whatever the table's size
-- when it was planned (tests/python/test_plans_young_install.py). The
-- setting holds for the helpers called from here too; every one of them is
-- written as probes.
-- Answers each item's outcome, in the order given.
CREATE FUNCTION _complete(
    p_run_ids text[],
    p_attempts integer[],
    p_tokens uuid[],
    p_results jsonb[],
    p_events jsonb[],
    p_keys_locked boolean DEFAULT TRUE
)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
DECLARE
    v_outcomes text[];
    v_marked boolean[];
    v_run runs;
    v_ids text[] := '{}'::text[];
    v_attempts integer[] := '{}'::integer[];
    v_results jsonb[] := '{}'::jsonb[];
    v_seqs bigint[];
    v_payloads jsonb[];
    v_keys text[];
    v_now timestamptz;
    v_counts integer[];
    v_tid tid;
    v_run_tids tid[];
    v_attempt_tids tid[];
    v_rtids tid[] := '{}'::tid[];
    v_atids tid[] := '{}'::tid[];
    v_keyed boolean;
    v_done bigint;
    v_woken text[];
    v_woken_seqs bigint[];
    v_count integer;
    v_seq bigint;
    v_head bigint;
BEGIN
    -- Without the key locks, only a lone item may come, and only to the
    -- one-item statements below.
    IF NOT p_keys_locked AND NOT (
        cardinality(p_run_ids) = 1 AND p_events[1] = '[]'::jsonb AND _fast_paths()
    ) THEN
        RETURN NULL;
    END IF;
    -- One item of a run without a key, no final_events. Step 1 for it (the
    -- filter on the key is what a keyed run needs: its _ended promotes the
    -- key's next run, so it goes through the steps below), then steps 2 to
    -- 4 in one statement, all or nothing, as for the common batch below. An
    -- item that does not pass writes nothing here and goes through the
    -- steps, which find its run already locked.
    IF cardinality(p_run_ids) = 1 AND p_events[1] = '[]'::jsonb AND _fast_paths() THEN
        SELECT r.attempt_count, r.ctid INTO v_count, v_tid
        FROM runs AS r
        WHERE r.run_id = p_run_ids[1] AND r.concurrency_key IS NULL
        FOR NO KEY UPDATE;
        IF NOT FOUND AND NOT p_keys_locked THEN
            RETURN NULL;
        END IF;
        IF FOUND THEN
            v_now := _now();
            WITH decided AS (
                SELECT a.ctid AS tid
                FROM attempts AS a
                WHERE
                    a.run_id = p_run_ids[1] AND a.attempt = p_attempts[1]
                    AND _fence_of(
                        p_run_ids[1], v_count, a.attempt, a.lease_token, a.status, a.outcome_op, a.outcome,
                        p_tokens[1], 'complete'
                    ) IS NULL
                    AND (SELECT TRUE FROM cancellations AS c WHERE c.run_id = p_run_ids[1]) IS NULL
                LIMIT 1
            ),
            attempt_done AS (
                UPDATE attempts AS a
                SET status = 'completed', finished_at = v_now, outcome = 'completed', outcome_op = 'complete'
                FROM decided AS d
                WHERE a.ctid = d.tid
            ),
            run_done AS (
                UPDATE runs AS r
                SET status = 'completed',
                    result = p_results[1],
                    wait = NULL,
                    wake_at = NULL,
                    finished_at = v_now,
                    updated_at = v_now,
                    ledger_seq = r.ledger_seq + 1
                FROM decided AS d
                WHERE r.ctid = v_tid
                RETURNING r.ledger_seq AS seq
            ),
            announced AS (
                INSERT INTO ledger_events AS l (
                    run_id, lane, seq, type, payload, delivery_key, transport_only,
                    created_at, next_attempt_at
                )
                SELECT
                    p_run_ids[1], 'lifecycle', d.seq, 'run.completed',
                    jsonb_build_object('attempt', p_attempts[1], 'result', p_results[1]),
                    p_run_ids[1] || ':' || d.seq, FALSE, v_now, v_now
                FROM run_done AS d
                RETURNING l.seq
            ),
            -- A CTE with a volatile call is computed whole, sent included.
            notified AS (
                SELECT
                    e.seq,
                    (
                        SELECT count(pg_notify(n.channel, json_build_object('run_id', p_run_ids[1], 'status', 'completed')::text))
                        FROM _notifying('terminal') AS n (channel)
                    ) AS sent
                FROM announced AS e
            )
            SELECT
                e.seq,
                (SELECT t.head_seq FROM ledger_lanes AS t WHERE t.run_id = p_run_ids[1] AND t.lane = 'lifecycle')
            INTO v_seq, v_head
            FROM notified AS e;
            IF FOUND THEN
                IF v_head IS NULL THEN
                    PERFORM _lanes_on_write(p_run_ids, ARRAY['lifecycle'], ARRAY[v_seq]);
                END IF;
                RETURN ARRAY['completed'];
            END IF;
        END IF;
    END IF;

    -- 1. The run rows, locked in the given order; what the fence reads of
    -- them (a locked row is its latest version), and where each is.
    SELECT
        array_agg(r.attempt_count ORDER BY g.i),
        array_agg(r.tid ORDER BY g.i),
        bool_or(r.concurrency_key IS NOT NULL)
    INTO v_counts, v_run_tids, v_keyed
    FROM generate_subscripts(p_run_ids, 1) AS g (i)
    LEFT JOIN LATERAL (
        SELECT r.attempt_count, r.ctid AS tid, r.concurrency_key
        FROM runs AS r
        WHERE r.run_id = p_run_ids[g.i]
        LIMIT 1
        FOR NO KEY UPDATE
    ) AS r ON TRUE;

    -- The common batch: no item has final_events and no run a key. Then
    -- steps 2 to 4 are one statement, all or none: it decides every item as
    -- step 2 does (the same fence, the same marker probe, in a snapshot taken
    -- after step 1's locks) and, only if every item passes, writes what step 4
    -- writes, run.completed as _emit_lifecycle writes it (reading each lane's
    -- head in the same statement, so only an empty lane goes to
    -- _lanes_on_write) and each run's runrelay_terminal notification, as
    -- _ended sends it (unless settings.notifications turns it off). _ended's
    -- other two tasks have nothing to do here: no run has a key to promote,
    -- and no marker was pending. A batch with an item that does not pass
    -- writes nothing here and goes through the steps below, which decide it
    -- item by item.
    IF NOT v_keyed AND p_events <@ ARRAY['[]'::jsonb] AND _fast_paths() THEN
        v_now := _now();
        WITH decided AS (
            SELECT
                g.i, a.tid,
                _fence_of(
                    CASE WHEN v_counts[g.i] IS NOT NULL THEN p_run_ids[g.i] END, v_counts[g.i],
                    a.attempt, a.lease_token, a.status, a.outcome_op, a.outcome, p_tokens[g.i], 'complete'
                ) IS NULL
                AND (SELECT TRUE FROM cancellations AS c WHERE c.run_id = p_run_ids[g.i]) IS NULL AS passed
            FROM generate_subscripts(p_run_ids, 1) AS g (i)
            LEFT JOIN LATERAL (
                SELECT a.attempt, a.lease_token, a.status, a.outcome_op, a.outcome, a.ctid AS tid
                FROM attempts AS a
                WHERE a.run_id = p_run_ids[g.i] AND a.attempt = p_attempts[g.i]
                LIMIT 1
            ) AS a ON TRUE
        ),
        passing AS (
            SELECT d.i, d.tid FROM decided AS d
            WHERE NOT EXISTS (SELECT FROM decided AS x WHERE NOT x.passed)
        ),
        attempts_done AS (
            UPDATE attempts AS a
            SET status = 'completed', finished_at = v_now, outcome = 'completed', outcome_op = 'complete'
            FROM passing AS p
            WHERE a.ctid = p.tid
        ),
        runs_done AS (
            UPDATE runs AS r
            SET status = 'completed',
                result = p_results[p.i],
                wait = NULL,
                wake_at = NULL,
                finished_at = v_now,
                updated_at = v_now,
                ledger_seq = r.ledger_seq + 1
            FROM passing AS p
            WHERE r.ctid = v_run_tids[p.i]
            RETURNING p.i, r.ledger_seq AS seq
        ),
        announced AS (
            INSERT INTO ledger_events AS l (
                run_id, lane, seq, type, payload, delivery_key, transport_only,
                created_at, next_attempt_at
            )
            SELECT
                p_run_ids[d.i], 'lifecycle', d.seq, 'run.completed',
                jsonb_build_object('attempt', p_attempts[d.i], 'result', p_results[d.i]),
                p_run_ids[d.i] || ':' || d.seq, FALSE, v_now, v_now
            FROM runs_done AS d
            RETURNING l.run_id, l.seq
        ),
        notified AS (
            SELECT
                e.run_id, e.seq,
                (
                    SELECT count(pg_notify(n.channel, json_build_object('run_id', e.run_id, 'status', 'completed')::text))
                    FROM _notifying('terminal') AS n (channel)
                ) AS sent
            FROM announced AS e
        )
        SELECT
            count(*),
            array_agg(e.run_id) FILTER (WHERE h.head_seq IS NULL),
            array_agg(e.seq) FILTER (WHERE h.head_seq IS NULL)
        INTO v_done, v_woken, v_woken_seqs
        FROM notified AS e
        LEFT JOIN LATERAL (
            SELECT t.head_seq FROM ledger_lanes AS t
            WHERE t.run_id = e.run_id AND t.lane = 'lifecycle'
            LIMIT 1
        ) AS h ON TRUE;
        IF v_done = cardinality(p_run_ids) THEN
            IF v_woken IS NOT NULL THEN
                PERFORM _lanes_on_write(v_woken, array_fill('lifecycle'::text, ARRAY[cardinality(v_woken)]), v_woken_seqs);
            END IF;
            RETURN array_fill('completed'::text, ARRAY[cardinality(p_run_ids)]);
        END IF;
    END IF;

    -- 2. A fresh snapshot: the attempts, the fence and the cancel markers.
    SELECT
        array_agg(_fence_of(
            CASE WHEN v_counts[g.i] IS NOT NULL THEN p_run_ids[g.i] END, v_counts[g.i],
            a.attempt, a.lease_token, a.status, a.outcome_op, a.outcome, p_tokens[g.i], 'complete'
        ) ORDER BY g.i),
        -- A probe per item (NOT EXISTS may become a hash anti join over
        -- every pending marker).
        array_agg((SELECT TRUE FROM cancellations AS c WHERE c.run_id = p_run_ids[g.i]) IS NOT NULL ORDER BY g.i),
        array_agg(a.tid ORDER BY g.i)
    INTO v_outcomes, v_marked, v_attempt_tids
    FROM generate_subscripts(p_run_ids, 1) AS g (i)
    LEFT JOIN LATERAL (
        SELECT a.attempt, a.lease_token, a.status, a.outcome_op, a.outcome, a.ctid AS tid
        FROM attempts AS a
        WHERE a.run_id = p_run_ids[g.i] AND a.attempt = p_attempts[g.i]
        LIMIT 1
    ) AS a ON TRUE;

    -- 3. One item at a time, only where needed.
    FOR v_i IN 1 .. cardinality(p_run_ids) LOOP
        IF v_outcomes[v_i] IS NULL AND v_marked[v_i] THEN
            SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_ids[v_i];
            IF _apply_marker(v_run, 'complete', p_attempts[v_i]) THEN
                v_outcomes[v_i] := 'cancelled';
            END IF;
        END IF;
        IF v_outcomes[v_i] IS NULL THEN
            IF jsonb_array_length(p_events[v_i]) > 0 THEN
                PERFORM _check_keys_unused('final_events', p_events[v_i]);
                PERFORM _append(p_run_ids[v_i], p_events[v_i]);
                -- The append wrote a new version of the run row.
                SELECT r.ctid INTO v_tid FROM runs AS r WHERE r.run_id = p_run_ids[v_i];
                v_run_tids[v_i] := v_tid;
            END IF;
            v_ids := v_ids || p_run_ids[v_i];
            v_attempts := v_attempts || p_attempts[v_i];
            v_results := v_results || p_results[v_i];
            v_rtids := v_rtids || v_run_tids[v_i];
            v_atids := v_atids || v_attempt_tids[v_i];
            v_outcomes[v_i] := 'completed';
        END IF;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        RETURN v_outcomes;
    END IF;

    -- 4. Updated where steps 1 and 2 found them: the rows cannot have moved
    -- since (the runs are locked, attempts change only under them, and a run
    -- that took final_events was found again).
    v_now := _now();
    WITH attempts_done AS (
        UPDATE attempts AS a
        SET status = 'completed', finished_at = v_now, outcome = 'completed', outcome_op = 'complete'
        FROM generate_subscripts(v_ids, 1) AS g (i)
        WHERE a.ctid = v_atids[g.i]
    ),
    runs_done AS (
        UPDATE runs AS r
        SET status = 'completed',
            result = v_results[g.i],
            wait = NULL,
            wake_at = NULL,
            finished_at = v_now,
            updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        FROM generate_subscripts(v_ids, 1) AS g (i)
        WHERE r.ctid = v_rtids[g.i]
        RETURNING g.i, r.ledger_seq AS seq, r.concurrency_key
    )
    SELECT
        array_agg(d.seq ORDER BY d.i),
        array_agg(jsonb_build_object('attempt', v_attempts[d.i], 'result', v_results[d.i]) ORDER BY d.i),
        array_agg(d.concurrency_key ORDER BY d.i)
    INTO v_seqs, v_payloads, v_keys
    FROM runs_done AS d;

    PERFORM _emit_lifecycle(v_ids, v_seqs, 'run.completed', v_payloads);
    PERFORM _ended(v_ids, 'completed', v_keys);
    RETURN v_outcomes;
END;
$$;

COMMENT ON FUNCTION _complete(text[], integer[], uuid[], jsonb[], jsonb[], boolean) IS
'Fences and completes attempts, one item per run in lock order: completed, cancelled (a marker won), fence_lost or a replay''s outcome.';
