-- Writing the run ledger: _append (events under a run lock, seqs reserved
-- here), _emit_lifecycle and _emit (engine lifecycle events at seqs the
-- caller reserved), and _lanes_on_write, the one rule by which written events
-- move their lanes (ledger_lanes, ledger_wakeups). The relay side of the
-- lanes is ledger_lanes.sql.

-- _lanes_on_write(): the lane rule of every ledger write. Element i of the three
-- arrays names a lane (p_run_ids[i], p_lanes[i]), each lane at most once, and
-- the first event just written to it (p_first_seqs[i]). Precondition: the
-- caller holds the row locks of the runs, taken before the events were
-- written, and the events are in the ledger (an earlier statement, or a
-- data-modifying CTE of the statement that calls this).
--
-- A write must not hold a lane row it does not change: a producer's
-- transaction may stay open long after it appended, and every relay call on
-- that lane (ack, renew, fail, release) would wait for it. So the lane rows
-- are read without a lock and only a lane that must change is touched:
--   * no row yet, or nothing pending (head_seq NULL): the new first event
--     becomes the head, available now (also when it is transport-only: the
--     next claim acknowledges it locally), with a runrelay_ledger
--     notification;
--   * a claimable, leased, not-yet-due, blocked or re-check head: untouched,
--     not even locked. Whatever a relay does next to that lane, it does
--     under the lane lock and ends with _refresh_lane.
-- A lane that must change is locked SKIP LOCKED, ascending by (run_id
-- COLLATE "C", lane): a writer never waits for a lane row (custody.sql: the
-- lane lock order). An empty lane a relay holds gets a wake-up row in
-- ledger_wakeups instead (schema/06_ledger.sql), which the next scan of the
-- lane consumes (_lane_scan_from) and discovery takes first: whatever the
-- holder does -- commit, roll back, or never look at the lane again -- the
-- event is found. A lane woken here consumes an earlier write's wake-up, and
-- its head goes back to that wake-up's first event.
--
-- Why that is safe under READ COMMITTED (the race: a relay acknowledges the
-- last pending event while this write is uncommitted, so its fresh read of
-- the tail does not see the new event, and this write saw a live head and
-- did not touch the lane). Relays never mark a lane empty blind:
-- _refresh_lane first tries a share lock on the run row, SKIP LOCKED. The
-- writer holds the run row lock from before its lane read until it commits,
-- so while it is in flight the relay's try fails and the relay leaves the
-- lane due for a re-check shortly after (available_at = now +
-- _lane_recheck()), when the committed event is seen and claimed. If the
-- relay's try succeeds, no write is in flight: one that committed before is
-- seen by the relay's fresh re-read of the tail, and one that starts later
-- waits for the run lock until the relay commits, so its lane read (a later
-- statement, a later snapshot) sees the empty lane and wakes it.
--
-- One statement for all the lanes; it notifies runrelay_ledger once per run
-- with a lane made claimable (unless settings.notifications turns ledger
-- off), and returns how many such runs there were.
CREATE FUNCTION _lanes_on_write(p_run_ids text[], p_lanes text[], p_first_seqs bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_notified integer;
    v_head bigint;
BEGIN
    IF cardinality(p_run_ids) = 1 THEN
        -- One lane (every single-run write), decided as below with one
        -- primary-key probe where it can be: the statement below, every CTE
        -- of which starts even when it has nothing to do, costs several
        -- times more. A lane whose head is live is left alone; a lane seen
        -- for the first time (a run's first event) is created, as `created`
        -- does. Only an empty lane needs the statement.
        SELECT t.head_seq INTO v_head
        FROM ledger_lanes AS t
        WHERE t.run_id = p_run_ids[1] AND t.lane = p_lanes[1];
        IF v_head IS NOT NULL THEN
            RETURN 0;
        END IF;
        IF NOT FOUND THEN
            INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
            VALUES (p_run_ids[1], p_lanes[1], p_first_seqs[1], v_now)
            ON CONFLICT (run_id, lane) DO NOTHING;
            IF FOUND THEN
                PERFORM pg_notify(n.channel, p_run_ids[1]) FROM _notifying('ledger') AS n (channel);
                RETURN 1;
            END IF;
        END IF;
    END IF;
    WITH written AS (
        -- generate_subscripts: the same row estimate in custom and generic
        -- plans, so the generic plan is kept (see claim_attempts).
        SELECT p_run_ids[g.i] AS run_id, p_lanes[g.i] AS lane, p_first_seqs[g.i] AS first_seq
        FROM generate_subscripts(p_run_ids, 1) AS g (i)
    ),
    existing AS (
        -- The lane rows, read without a lock: one primary-key probe per
        -- written lane (LIMIT keeps it a probe; see claim_attempts). No
        -- "= ANY(array)": its estimate differs between custom and generic
        -- plans, and PostgreSQL would then plan this statement on every call.
        SELECT f.run_id, f.lane, f.first_seq, t.head_seq
        FROM written AS f
        CROSS JOIN LATERAL (
            SELECT t.head_seq
            FROM ledger_lanes AS t
            WHERE t.run_id = f.run_id AND t.lane = f.lane
            LIMIT 1
        ) AS t
    ),
    created AS (
        -- A lane seen for the first time (lane rows are created only by
        -- writers, under the run lock, so none can be in flight; DO NOTHING
        -- is a guard). Only lanes not seen above are inserted: an insert
        -- that met an existing row would wait for a relay updating it.
        INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
        SELECT f.run_id, f.lane, f.first_seq, v_now
        FROM written AS f
        WHERE NOT EXISTS (SELECT 1 FROM existing AS x WHERE x.run_id = f.run_id AND x.lane = f.lane)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING ll.run_id, ll.available_at
    ),
    must_change AS (
        -- Empty lanes, locked without waiting, one probe each, in the lane
        -- order; a lane whose head is live is neither changed nor locked.
        SELECT t.run_id, t.lane
        FROM (
            SELECT x.run_id, x.lane
            FROM existing AS x
            WHERE x.head_seq IS NULL
            ORDER BY x.run_id COLLATE "C", x.lane
        ) AS x
        CROSS JOIN LATERAL (
            SELECT t.run_id, t.lane
            FROM ledger_lanes AS t
            WHERE t.run_id = x.run_id AND t.lane = x.lane AND t.head_seq IS NULL
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AS t
    ),
    consumed AS (
        -- An earlier write's wake-up of a lane this one now wakes: the
        -- head goes back to its first event.
        DELETE FROM ledger_wakeups AS w
        WHERE (w.run_id, w.lane) IN (SELECT m.run_id, m.lane FROM must_change AS m)
        RETURNING w.run_id, w.lane, w.first_seq
    ),
    woken AS (
        UPDATE ledger_lanes AS ll
        SET head_seq = least(x.first_seq, c.first_seq), available_at = v_now
        FROM must_change AS m
        INNER JOIN existing AS x ON m.run_id = x.run_id AND m.lane = x.lane
        LEFT JOIN consumed AS c ON m.run_id = c.run_id AND m.lane = c.lane
        WHERE ll.run_id = m.run_id AND ll.lane = m.lane
        RETURNING ll.run_id, ll.available_at
    ),
    left_awake AS (
        -- An empty lane a relay holds: the wake-up goes to ledger_wakeups
        -- (an earlier one, with an earlier first event, is kept).
        INSERT INTO ledger_wakeups AS w (run_id, lane, first_seq, created_at)
        SELECT x.run_id, x.lane, x.first_seq, v_now
        FROM existing AS x
        WHERE
            x.head_seq IS NULL
            AND NOT EXISTS (SELECT 1 FROM must_change AS m WHERE m.run_id = x.run_id AND m.lane = x.lane)
        ON CONFLICT (run_id, lane) DO NOTHING
        RETURNING w.run_id, w.created_at AS available_at
    ),
    became_available AS (
        SELECT c.run_id, c.available_at FROM created AS c
        UNION ALL
        SELECT w.run_id, w.available_at FROM woken AS w
        UNION ALL
        SELECT a.run_id, a.available_at FROM left_awake AS a
    ),
    notified AS (
        SELECT
            a.run_id,
            (SELECT count(pg_notify(n.channel, a.run_id)) FROM _notifying('ledger') AS n (channel)) AS sent
        FROM (SELECT DISTINCT b.run_id FROM became_available AS b WHERE b.available_at IS NOT NULL) AS a
    )
    SELECT count(*) INTO v_notified FROM notified;
    RETURN v_notified;
END;
$$;

COMMENT ON FUNCTION _lanes_on_write(text[], text[], bigint[]) IS
'The lane rule of every ledger write: wakes the written lanes that had nothing pending, never waiting for a lane row.';

-- _append(): the one routine that appends events to a run's ledger.
--
-- Precondition: the caller holds the run's row lock (custody), taken in an
-- earlier statement, so advancing runs.ledger_seq serialises appends to one
-- run and per-run seq order equals commit order. `p_events` must come from
-- _normalize_events() or the engine. (Transitions, which advance ledger_seq
-- in their own UPDATE of the run, use _emit_lifecycle instead.) The lanes
-- move by _lanes_on_write, called from the same statement.
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
    -- One statement: reserve seqs, insert the events, then (the aggregate
    -- reads every inserted row first) move their lanes.
    RETURN QUERY
    WITH bumped AS (
        UPDATE runs AS r
        SET ledger_seq = r.ledger_seq + v_count
        WHERE r.run_id = p_run_id
        RETURNING r.ledger_seq - v_count AS base
    ),
    inserted AS (
        INSERT INTO ledger_events AS l (
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
    lanes AS (
        SELECT _lanes_on_write(array_agg(p_run_id), array_agg(f.lane), array_agg(f.first_seq)) AS notified
        FROM firsts AS f
    )
    SELECT i.event_id, i.seq, i.delivery_key
    FROM inserted AS i
    CROSS JOIN lanes AS n
    ORDER BY i.seq;
END;
$$;

COMMENT ON FUNCTION _append(text, jsonb) IS
'Appends normalised events to a run''s ledger under the caller''s run lock; maintains ledger_lanes.';

-- _emit_lifecycle(): one engine lifecycle event of type p_type for each of
-- several runs (a batch claim's run.started, a batch completion's
-- run.completed; _emit passes one). The caller holds the runs' row locks and
-- reserved each seq with ledger_seq + 1 in its own UPDATE of the run. One
-- statement writes the events and finds the lanes that may need to move;
-- _lanes_on_write, the rule _append follows, moves those. Returns what _lanes_on_write
-- does: how many of the runs it notified on runrelay_ledger.
CREATE FUNCTION _emit_lifecycle(
    p_run_ids text[],
    p_seqs bigint[],
    p_type text,
    p_payloads jsonb[],
    p_transport_only boolean DEFAULT FALSE
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_ids text[];
    v_seqs bigint[];
BEGIN
    IF coalesce(cardinality(p_run_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- generate_subscripts: the same row estimate in custom and generic
    -- plans, so the generic plan is kept (see _claim). One event per run, so
    -- the order of the rows does not matter.
    --
    -- The same statement reads each run's lifecycle lane, without a lock (a
    -- primary-key probe; the snapshot is later than the run locks the
    -- caller took, as _lanes_on_write requires): a lane whose head is live is
    -- left alone, exactly as _lanes_on_write would leave it, and only the others
    -- are handed to _lanes_on_write. Most writes meet a live head, and then the
    -- event costs this one statement.
    WITH inserted AS (
        INSERT INTO ledger_events AS l (
            run_id, lane, seq, type, payload, delivery_key, transport_only,
            created_at, next_attempt_at
        )
        SELECT
            p_run_ids[g.i], 'lifecycle', p_seqs[g.i], p_type, coalesce(p_payloads[g.i], 'null'::jsonb),
            p_run_ids[g.i] || ':' || p_seqs[g.i], p_transport_only, v_now, v_now
        FROM generate_subscripts(p_run_ids, 1) AS g (i)
        RETURNING l.run_id, l.seq
    )
    SELECT array_agg(i.run_id), array_agg(i.seq)
    INTO v_ids, v_seqs
    FROM inserted AS i
    WHERE (
        SELECT t.head_seq FROM ledger_lanes AS t
        WHERE t.run_id = i.run_id AND t.lane = 'lifecycle'
        LIMIT 1
    ) IS NULL;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN _lanes_on_write(v_ids, array_fill('lifecycle'::text, ARRAY[cardinality(v_ids)]), v_seqs);
END;
$$;

COMMENT ON FUNCTION _emit_lifecycle(text[], bigint[], text, jsonb[], boolean) IS
'Appends one lifecycle event of a type to each of several locked runs at reserved seqs, moving their lanes.';

-- _emit(): one engine lifecycle event (run.queued, run.completed, ...) of
-- one run: _emit_lifecycle of one run at p_seq, the seq the caller reserved
-- with ledger_seq + 1 in its own UPDATE of the run row (every caller does;
-- events whose seqs are not reserved yet go through _append).
CREATE FUNCTION _emit(
    p_run_id text,
    p_type text,
    p_payload jsonb,
    p_transport_only boolean,
    p_seq bigint
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _emit_lifecycle(ARRAY[p_run_id], ARRAY[p_seq], p_type, ARRAY[p_payload], p_transport_only);
END;
$$;

COMMENT ON FUNCTION _emit(text, text, jsonb, boolean, bigint) IS
'Appends one engine lifecycle event to a run''s lifecycle lane at the seq the caller reserved (caller holds the run lock).';
