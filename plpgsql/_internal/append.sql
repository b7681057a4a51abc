-- _append(): the one routine that writes the run ledger.
--
-- Precondition: the caller holds the run's row lock (custody), so advancing
-- runs.ledger_seq serialises appends to one run and per-run seq order equals
-- commit order. `p_events` must come from _normalize_events() or the engine.
-- (Transitions, which advance ledger_seq in their own UPDATE of the run, use
-- _emit_lifecycle instead.)
--
-- Also keeps ledger_lanes current: a lane that had nothing pending gets its
-- head and becomes available now (and a runrelay_ledger notification) —
-- also when that head is transport-only, since the next claim acknowledges
-- it locally; a lane with a claimable, leased or blocked head keeps its
-- state. The upsert locks the lane row, which is what makes an append and a
-- relay's ack of the last pending event safe in either order (the ack
-- re-reads the tail after taking the lane lock).
CREATE FUNCTION _append(p_run_id text, p_events jsonb)
RETURNS SETOF append_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_count integer := jsonb_array_length(p_events);
    v_now timestamptz := _now();
BEGIN
    IF v_count = 0 THEN
        RETURN;
    END IF;
    -- One statement: reserve seqs, insert the events, move lane heads, notify.
    -- ON CONFLICT ... WHERE locks a lane row that already has a live head
    -- without rewriting it; RETURNING yields exactly the lanes that became
    -- available.
    RETURN QUERY
    WITH bumped AS (
        UPDATE runs AS r
        SET ledger_seq = r.ledger_seq + v_count
        WHERE r.run_id = p_run_id
        RETURNING r.ledger_seq - v_count AS base
    ),
    inserted AS (
        INSERT INTO ledger AS l (
            run_id, lane, seq, type, payload, delivery_key, transport_only,
            created_at, next_attempt_at
        )
        SELECT
            p_run_id,
            e.value ->> 'lane',
            b.base + e.ordinality,
            e.value ->> 'type',
            e.value -> 'payload',
            coalesce(e.value ->> 'delivery_key', p_run_id || ':' || (b.base + e.ordinality)),
            (e.value ->> 'transport_only')::boolean,
            v_now,
            v_now
        FROM bumped AS b
        CROSS JOIN jsonb_array_elements(p_events) WITH ORDINALITY AS e (value, ordinality)
        ORDER BY e.ordinality
        RETURNING l.event_id, l.seq, l.delivery_key, l.lane
    ),
    firsts AS (
        SELECT i.lane, min(i.seq) AS first_seq
        FROM inserted AS i
        GROUP BY i.lane
    ),
    became_available AS (
        INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
        SELECT p_run_id, f.lane, f.first_seq, v_now
        FROM firsts AS f
        ON CONFLICT (run_id, lane) DO UPDATE
        SET head_seq = excluded.head_seq, available_at = excluded.available_at
        WHERE ll.head_seq IS NULL
        RETURNING ll.available_at
    ),
    notified AS (
        SELECT pg_notify('runrelay_ledger', p_run_id)
        FROM became_available AS a
        WHERE a.available_at IS NOT NULL
        LIMIT 1
    )
    SELECT i.event_id, i.seq, i.delivery_key
    FROM inserted AS i
    CROSS JOIN (SELECT count(*) AS n FROM notified) AS n
    ORDER BY i.seq;
END;
$$;

COMMENT ON FUNCTION _append(text, jsonb) IS
'Appends normalised events to a run''s ledger under the caller''s run lock; maintains ledger_lanes.';

-- _emit_lifecycle(): one engine lifecycle event of type p_type for each of
-- several runs (a batch claim's run.started, a batch completion's
-- run.completed; _emit passes one). The caller holds the runs' row locks and
-- reserved each seq with ledger_seq + 1 in its own UPDATE of the run. One
-- statement writes the events (in array order) and moves their lanes under the
-- rule _append follows: a lane with nothing pending gets the event as its head,
-- available now (transport-only or not); a lane with a live head keeps it
-- (the conflict only locks the row).
CREATE FUNCTION _emit_lifecycle(
    p_run_ids text[],
    p_seqs bigint[],
    p_type text,
    p_payloads jsonb[],
    p_transport_only boolean DEFAULT FALSE
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_available text[];
BEGIN
    WITH events AS (
        INSERT INTO ledger AS l (
            run_id, lane, seq, type, payload, delivery_key, transport_only,
            created_at, next_attempt_at
        )
        -- generate_subscripts: the same row estimate in custom and generic
        -- plans, so the generic plan is kept (see claim_attempts).
        SELECT
            p_run_ids[g.i], 'lifecycle', p_seqs[g.i], p_type, coalesce(p_payloads[g.i], 'null'::jsonb),
            p_run_ids[g.i] || ':' || p_seqs[g.i], p_transport_only, v_now, v_now
        FROM generate_subscripts(p_run_ids, 1) AS g (i)
        ORDER BY g.i
        RETURNING l.run_id, l.seq
    ),
    lanes AS (
        INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
        SELECT e.run_id, 'lifecycle', e.seq, v_now
        FROM events AS e
        ON CONFLICT (run_id, lane) DO UPDATE
        SET head_seq = excluded.head_seq, available_at = excluded.available_at
        WHERE ll.head_seq IS NULL
        RETURNING ll.run_id, ll.available_at
    )
    SELECT array_agg(n.run_id) INTO v_available FROM lanes AS n WHERE n.available_at IS NOT NULL;
    PERFORM pg_notify('runrelay_ledger', a.run_id) FROM unnest(v_available) AS a (run_id);
END;
$$;

COMMENT ON FUNCTION _emit_lifecycle(text[], bigint[], text, jsonb[], boolean) IS
'Appends one lifecycle event of a type to each of several locked runs at reserved seqs, moving their lanes.';

-- _emit(): one engine lifecycle event (run.started, run.completed, ...).
-- Transitions pass p_seq, the seq they reserved with ledger_seq + 1 in their
-- own UPDATE of the run row: _emit_lifecycle of one run, so the lane rule of
-- lifecycle events is written once. Without p_seq, _append reserves the seq.
CREATE FUNCTION _emit(
    p_run_id text,
    p_type text,
    p_payload jsonb,
    p_transport_only boolean DEFAULT FALSE,
    p_seq bigint DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_seq IS NULL THEN
        PERFORM _append(p_run_id, jsonb_build_array(jsonb_build_object(
            'type', p_type,
            'payload', p_payload,
            'lane', 'lifecycle',
            'delivery_key', NULL,
            'transport_only', p_transport_only
        )));
    ELSE
        PERFORM _emit_lifecycle(ARRAY[p_run_id], ARRAY[p_seq], p_type, ARRAY[p_payload], p_transport_only);
    END IF;
END;
$$;

COMMENT ON FUNCTION _emit(text, text, jsonb, boolean, bigint) IS
'Appends one engine lifecycle event to a run''s lifecycle lane (caller holds the run lock; p_seq if it reserved one).';
