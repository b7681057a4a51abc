-- _append(): the one routine that writes the run ledger.
--
-- Precondition: the caller holds the run's row lock (custody), taken in an
-- earlier statement, so advancing runs.ledger_seq serialises appends to one
-- run and per-run seq order equals commit order. `p_events` must come from
-- _normalize_events() or the engine. (Transitions, which advance ledger_seq
-- in their own UPDATE of the run, use _emit_lifecycle instead.)
--
-- Lanes. An append also keeps ledger_lanes current, but it must not hold a
-- lane row it does not change: a producer's transaction may stay open long
-- after it appended, and every relay call on that lane (ack, renew, fail,
-- release) would wait for it. So the lane rows are read without a lock and
-- only a lane that must change is touched:
--   * no row yet, or nothing pending (head_seq NULL): the new first event
--     becomes the head, available now (also when it is transport-only: the
--     next claim acknowledges it locally), with a runrelay_ledger
--     notification;
--   * a claimable, leased, not-yet-due, blocked or re-check head: untouched,
--     not even locked. Whatever a relay does next to that lane, it does
--     under the lane lock and ends with _refresh_lane.
-- A lane that must change is locked SKIP LOCKED: an appender never waits for
-- a lane row (custody.sql: the lane lock order). An empty lane a relay holds
-- gets a wake-up row in ledger_wakeups instead (schema/06_ledger.sql), which
-- the next scan of the lane consumes (_lane_scan_from) and discovery takes
-- first: whatever the holder does -- commit, roll back, or never look at the
-- lane again -- the event is found. A lane woken here consumes an earlier
-- append's wake-up, and its head goes back to that wake-up's first event.
--
-- Why that is safe under READ COMMITTED (the race: a relay acknowledges the
-- last pending event while this append is uncommitted, so its fresh read of
-- the tail does not see the new event, and this append saw a live head and
-- did not touch the lane). Relays never mark a lane empty blind:
-- _refresh_lane first tries a share lock on the run row, SKIP LOCKED. This
-- appender holds the run row lock from before its lane read until it
-- commits, so while it is in flight the relay's try fails and the relay
-- leaves the lane due for a re-check shortly after (available_at = now +
-- _lane_recheck()), when the committed event is seen and claimed. If the
-- relay's try succeeds, no append is in flight: one that committed before
-- is seen by the relay's fresh re-read of the tail, and one that starts
-- later waits for the run lock until the relay commits, so its lane read (a
-- later statement, a later snapshot) sees the empty lane and wakes it.
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
    -- One statement: reserve seqs, insert the events, move the lanes that
    -- must change (see above), notify. RETURNING yields exactly the lanes
    -- that became available.
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
    existing AS (
        -- The run's lane rows, read without a lock.
        SELECT t.lane, t.head_seq
        FROM ledger_lanes AS t
        WHERE t.run_id = p_run_id AND t.lane IN (SELECT f.lane FROM firsts AS f)
    ),
    created AS (
        -- A lane seen for the first time (lane rows are created only by
        -- appenders, under the run lock, so none can be in flight; DO
        -- NOTHING is a guard). Only lanes not seen above are inserted: an
        -- insert that met an existing row would wait for a relay updating it.
        INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
        SELECT p_run_id, f.lane, f.first_seq, v_now
        FROM firsts AS f
        WHERE f.lane NOT IN (SELECT x.lane FROM existing AS x)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING ll.available_at
    ),
    must_change AS (
        -- Empty lanes, locked without waiting; a lane whose head is live
        -- is neither changed nor locked.
        SELECT t.lane
        FROM ledger_lanes AS t
        WHERE
            t.run_id = p_run_id
            AND t.lane IN (SELECT x.lane FROM existing AS x WHERE x.head_seq IS NULL)
            AND t.head_seq IS NULL
        ORDER BY t.lane
        FOR UPDATE SKIP LOCKED
    ),
    consumed AS (
        -- An earlier append's wake-up of a lane this one now wakes: the
        -- head goes back to its first event.
        DELETE FROM ledger_wakeups AS w
        WHERE w.run_id = p_run_id AND w.lane IN (SELECT m.lane FROM must_change AS m)
        RETURNING w.lane, w.first_seq
    ),
    woken AS (
        UPDATE ledger_lanes AS ll
        SET head_seq = least(f.first_seq, c.first_seq), available_at = v_now
        FROM must_change AS m
        INNER JOIN firsts AS f ON m.lane = f.lane
        LEFT JOIN consumed AS c ON m.lane = c.lane
        WHERE ll.run_id = p_run_id AND ll.lane = m.lane
        RETURNING ll.available_at
    ),
    left_awake AS (
        -- An empty lane a relay holds: the wake-up goes to ledger_wakeups
        -- (an earlier one, with an earlier first event, is kept).
        INSERT INTO ledger_wakeups AS w (run_id, lane, first_seq, created_at)
        SELECT p_run_id, x.lane, f.first_seq, v_now
        FROM existing AS x
        INNER JOIN firsts AS f ON x.lane = f.lane
        WHERE x.head_seq IS NULL AND x.lane NOT IN (SELECT m.lane FROM must_change AS m)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING w.created_at AS available_at
    ),
    became_available AS (
        SELECT c.available_at FROM created AS c
        UNION ALL
        SELECT w.available_at FROM woken AS w
        UNION ALL
        SELECT a.available_at FROM left_awake AS a
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
-- rule _append follows (see its header): a lane with nothing pending gets the
-- event as its head, available now (transport-only or not); a lane with a
-- live head is neither changed nor locked; lanes that must change are locked
-- SKIP LOCKED (a held one gets a wake-up row), so this never waits for a lane
-- row.
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
    existing AS (
        SELECT t.run_id, t.head_seq
        FROM ledger_lanes AS t
        WHERE t.run_id = ANY(p_run_ids) AND t.lane = 'lifecycle'
    ),
    created AS (
        INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
        SELECT e.run_id, 'lifecycle', e.seq, v_now
        FROM events AS e
        WHERE e.run_id NOT IN (SELECT x.run_id FROM existing AS x)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING ll.run_id, ll.available_at
    ),
    must_change AS (
        SELECT t.run_id
        FROM ledger_lanes AS t
        WHERE
            t.run_id IN (SELECT x.run_id FROM existing AS x WHERE x.head_seq IS NULL)
            AND t.lane = 'lifecycle'
            AND t.head_seq IS NULL
        ORDER BY t.run_id COLLATE "C"
        FOR UPDATE SKIP LOCKED
    ),
    consumed AS (
        DELETE FROM ledger_wakeups AS w
        WHERE w.run_id IN (SELECT m.run_id FROM must_change AS m) AND w.lane = 'lifecycle'
        RETURNING w.run_id, w.first_seq
    ),
    woken AS (
        UPDATE ledger_lanes AS ll
        SET head_seq = least(e.seq, c.first_seq), available_at = v_now
        FROM must_change AS m
        INNER JOIN events AS e ON m.run_id = e.run_id
        LEFT JOIN consumed AS c ON m.run_id = c.run_id
        WHERE ll.run_id = m.run_id AND ll.lane = 'lifecycle'
        RETURNING ll.run_id, ll.available_at
    ),
    left_awake AS (
        INSERT INTO ledger_wakeups AS w (run_id, lane, first_seq, created_at)
        SELECT x.run_id, 'lifecycle', e.seq, v_now
        FROM existing AS x
        INNER JOIN events AS e ON x.run_id = e.run_id
        WHERE x.head_seq IS NULL AND x.run_id NOT IN (SELECT m.run_id FROM must_change AS m)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING w.run_id, w.created_at AS available_at
    ),
    lanes AS (
        SELECT c.run_id, c.available_at FROM created AS c
        UNION ALL
        SELECT w.run_id, w.available_at FROM woken AS w
        UNION ALL
        SELECT a.run_id, a.available_at FROM left_awake AS a
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
