-- _claim_lane(): claim the head prefix of one run's lane for a relay; and
-- _ledger_claimable(), its test of one event (at the end of this file).
--
-- Precondition: the caller holds the lane row lock (ledger_lanes). Every read
-- of the tail below is a fresh statement, so an append that committed while
-- the caller waited for the lock is seen. p_from, when given, is a seq no
-- undelivered event of the lane precedes (ack_ledger passes the seq after the
-- prefix it just acknowledged): the tail scan starts there.
--
-- Time: the clock is read once the lock is held (_clock_now()), so a lock
-- wait is not charged to the lease: leases expire lease_seconds after they
-- are granted, and lease_remaining_ms is measured when the rows are returned.
--
-- In order:
--   * expected_head: the named event must be the head, or lie behind nothing
--     but due transport-only events (fewer than 1000, what one call
--     acknowledges locally), and be claimable itself; otherwise nothing is
--     done. The transport-only events in front are acknowledged locally on
--     the way, as any claim would;
--   * a failed head, a head leased to another relay (live lease) or a head
--     not yet due blocks the lane: nothing;
--   * a head in a frozen batch: exactly that batch's undelivered members are
--     (re)leased to this relay, never widened (and never past a member that
--     failed, which blocks the lane behind it);
--   * a due transport-only head is acknowledged locally (kind local_ack,
--     through _acknowledge, like a delivery: retention, notification, lag),
--     with the due transport-only events right behind it, whether or not
--     anything follows them; then the next event is the head. A named
--     transport-only event ends the call once acknowledged: the call claims
--     exactly what it named;
--   * otherwise the head, and with p_batch up to p_max consecutive claimable
--     successors (stopping at the first failed, not-due, foreign-leased,
--     transport-only or frozen event), are leased; with p_batch they form a
--     new frozen batch.
-- A lease is written on the lane row, not on the events (the lease
-- watermark, schema/06_ledger.sql): one update of one row gives this relay
-- the lane's events from the head through leased_through (and, for a new
-- batch, makes them the frozen batch through batch_through), whatever the
-- batch size. The lease carries p_call_id, and every row acknowledged
-- locally is tagged with it: that is what claim_ledger and ack_ledger
-- replays look up. Finally, unless the call leased (the lease's update
-- already wrote what a recomputation would), the lane's availability is
-- recomputed.
CREATE FUNCTION _claim_lane(
    p_relay text,
    p_run_id text,
    p_lane text,
    p_max integer,
    p_batch boolean,
    p_lease interval,
    p_call_id uuid,
    p_expected_head bigint,
    p_from bigint DEFAULT NULL
)
RETURNS SETOF ack_ledger_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    -- The lane lock is held: a lease granted now runs from now.
    v_now timestamptz := _clock_now();
    -- When the answer is read, for lease_remaining_ms.
    v_answered timestamptz;
    v_lane ledger_lanes;
    v_head ledger_events;
    v_target ledger_events;
    v_event ledger_events;
    v_local_acks integer := 0;
    v_members bigint[];
    v_last bigint;
    v_batch uuid;
    v_frozen boolean;
    v_from bigint;
    v_front bigint;
    v_front_ok boolean;
    v_leased boolean := FALSE;
BEGIN
    -- Start at the lane's known head, or an earlier wake-up (_lane_scan_from).
    v_from := _lane_scan_from(p_run_id, p_lane, p_from);
    SELECT ll.* INTO v_lane FROM ledger_lanes AS ll WHERE ll.run_id = p_run_id AND ll.lane = p_lane;

    IF p_expected_head IS NOT NULL THEN
        SELECT l.* INTO v_target
        FROM ledger_events AS l
        WHERE
            l.event_id = p_expected_head AND l.run_id = p_run_id AND l.lane = p_lane
            AND l.delivered_at IS NULL AND l.seq >= v_from;
        -- What lies in front of it must all be due transport-only events,
        -- fewer than the 1000 one call acknowledges locally (which bounds
        -- this scan too).
        SELECT count(*), coalesce(bool_and((f.e).transport_only AND _ledger_claimable(f.e, v_lane, p_relay, v_now)), TRUE)
        INTO v_front, v_front_ok
        FROM (
            SELECT l AS e
            FROM ledger_events AS l
            WHERE
                l.run_id = p_run_id AND l.lane = p_lane AND l.seq >= v_from
                AND l.seq < v_target.seq AND l.delivered_at IS NULL
            ORDER BY l.seq
            LIMIT 1000
        ) AS f;
        IF v_target.event_id IS NULL OR NOT v_front_ok OR v_front >= 1000
            OR NOT _ledger_claimable(v_target, v_lane, p_relay, v_now) THEN
            PERFORM _refresh_lane(p_run_id, p_lane, v_from);
            RETURN;
        END IF;
    END IF;

    LOOP
        SELECT l.* INTO v_head
        FROM ledger_events AS l
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane AND l.seq >= v_from
            AND l.delivered_at IS NULL
        ORDER BY l.seq
        LIMIT 1;
        EXIT WHEN v_head.event_id IS NULL OR NOT _ledger_claimable(v_head, v_lane, p_relay, v_now);

        IF v_head.transport_only AND NOT coalesce(v_head.seq <= v_lane.batch_through, FALSE) THEN
            -- The due transport-only run from the head, up to the named event.
            v_members := '{}'::bigint[];
            FOR v_event IN
                SELECT l.*
                FROM ledger_events AS l
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane AND l.seq >= v_head.seq
                    AND l.delivered_at IS NULL
                ORDER BY l.seq
                LIMIT 1000 - v_local_acks
            LOOP
                EXIT WHEN NOT v_event.transport_only OR NOT _ledger_claimable(v_event, v_lane, p_relay, v_now);
                v_members := v_members || v_event.event_id;
                v_from := v_event.seq + 1;
                EXIT WHEN v_event.event_id = p_expected_head;
            END LOOP;
            RETURN QUERY SELECT * FROM _acknowledge(p_run_id, v_members, p_relay, v_now, TRUE, p_call_id);
            v_local_acks := v_local_acks + cardinality(v_members);
            EXIT WHEN v_members[cardinality(v_members)] = p_expected_head OR v_local_acks >= 1000;
            CONTINUE;
        END IF;

        v_frozen := coalesce(v_head.seq <= v_lane.batch_through, FALSE);
        IF v_frozen THEN
            -- A frozen batch: exactly its undelivered members, never past
            -- one that failed (it blocks what follows).
            SELECT coalesce(min(f.seq) - 1, v_lane.batch_through) INTO v_last
            FROM ledger_events AS f
            WHERE
                f.run_id = p_run_id AND f.lane = p_lane
                AND f.seq >= v_head.seq AND f.seq <= v_lane.batch_through
                AND f.failed_at IS NOT NULL;
            v_batch := v_lane.batch_id;
        ELSE
            -- The head, and with p_batch its claimable successors: a new batch.
            v_last := v_head.seq;
            v_batch := NULL;
            IF p_batch AND p_max > 1 THEN
                -- The successors up to the first one that is transport-only
                -- or not claimable, in one statement: a running AND over
                -- them in seq order marks the ones before it.
                SELECT coalesce(max(s.seq) FILTER (WHERE s.before_stop), v_head.seq) INTO v_last
                FROM (
                    SELECT
                        f.seq,
                        bool_and(
                            NOT coalesce(
                                f.transport_only OR NOT _ledger_claimable_at(
                                    f.seq, f.delivered_at, f.failed_at, f.next_attempt_at,
                                    v_lane.leased_through, v_lane.lease_owner, v_lane.lease_expires_at, p_relay, v_now
                                ),
                                FALSE
                            )
                        ) OVER (ORDER BY f.seq) AS before_stop
                    FROM (
                        SELECT l.seq, l.transport_only, l.delivered_at, l.failed_at, l.next_attempt_at
                        FROM ledger_events AS l
                        WHERE
                            l.run_id = p_run_id AND l.lane = p_lane AND l.seq > v_head.seq
                            AND l.delivered_at IS NULL
                        ORDER BY l.seq
                        LIMIT p_max - 1
                    ) AS f
                ) AS s;
                v_batch := gen_random_uuid();
            END IF;
        END IF;
        -- The lease: one update of the lane row, whatever the batch size.
        UPDATE ledger_lanes AS ll
        SET lease_owner = p_relay,
            lease_expires_at = v_now + p_lease,
            leased_through = v_last,
            lease_call_id = CASE WHEN v_frozen THEN coalesce(p_call_id, ll.lease_call_id) ELSE p_call_id END,
            batch_id = v_batch,
            batch_started_at = CASE
                WHEN v_frozen THEN ll.batch_started_at
                WHEN v_batch IS NOT NULL THEN v_now
            END,
            batch_through = CASE
                WHEN v_frozen THEN ll.batch_through
                WHEN v_batch IS NOT NULL THEN v_last
            END,
            head_seq = v_head.seq,
            delivered_below = v_head.seq,
            available_at = v_now + p_lease,
            blocked = FALSE
        WHERE ll.run_id = p_run_id AND ll.lane = p_lane
        RETURNING ll.* INTO v_lane;
        v_answered := _clock_now();
        RETURN QUERY
        SELECT x.*
        FROM ledger_events AS l
        CROSS JOIN LATERAL _ledger_row('claimed', l, v_lane.batch_id, v_lane.lease_expires_at, v_answered) AS x
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane
            AND l.seq >= v_head.seq AND l.seq <= v_last
            AND l.delivered_at IS NULL
        ORDER BY l.seq;
        v_leased := TRUE;
        v_from := v_head.seq;
        EXIT;
    END LOOP;
    -- A lease just written leaves the lane as _refresh_lane would: its head
    -- is the leased head, available when the lease expires, with the lease
    -- and batch it covers, and the wake-ups read at the start consumed. So
    -- only a claim that leased nothing recomputes the lane (reading its tail
    -- and lane row again would cost a fifth of a short lane's claim). A
    -- wake-up an appender leaves while this call holds the lane is consumed
    -- by whichever call takes the lane next (the ack, or a claim after the
    -- lease expires), as any wake-up is.
    IF NOT (v_leased AND _fast_paths()) THEN
        PERFORM _refresh_lane(p_run_id, p_lane, v_from);
    END IF;
END;
$$;

COMMENT ON FUNCTION _claim_lane(text, text, text, integer, boolean, interval, uuid, bigint, bigint) IS
'Claims one run lane''s head prefix for a relay (caller holds the lane lock); see claim_ledger.';

-- _ledger_claimable(): whether event p_event of lane p_lane (its row as the
-- caller holds it locked) can be claimed by p_relay at p_now (ignoring
-- order: _claim_lane checks that). Inside the lane's lease (every
-- undelivered event at most leased_through is): when the lease is this
-- relay's, or has expired. Otherwise: not failed, and due.
-- A claim of a batch tests every event of it, so this is written to be
-- inlined as _ledger_row is (ledger_row.sql): a SQL-standard body, IMMUTABLE
-- (it reads only its arguments), no SET clause. The successors of a new
-- batch are tested in one statement too, not in a loop: together, a claim of
-- 100 events went from 617 to 497 us of server time.
CREATE FUNCTION _ledger_claimable_at(
    p_seq bigint,
    p_delivered_at timestamptz,
    p_failed_at timestamptz,
    p_next_attempt_at timestamptz,
    p_leased_through bigint,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_relay text,
    p_now timestamptz
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN
p_delivered_at IS NULL AND p_failed_at IS NULL
AND CASE
    WHEN p_seq <= p_leased_through
        THEN p_lease_owner = p_relay OR p_lease_expires_at <= p_now
    ELSE p_next_attempt_at <= p_now
END;

COMMENT ON FUNCTION _ledger_claimable_at(
    bigint, timestamptz, timestamptz, timestamptz, bigint, text, timestamptz, text, timestamptz
) IS
'_ledger_claimable on the event''s and the lane''s columns (inlined; a batch''s successors are tested on columns).';

CREATE FUNCTION _ledger_claimable(p_event ledger_events, p_lane ledger_lanes, p_relay text, p_now timestamptz)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN _ledger_claimable_at(
    (p_event).seq, (p_event).delivered_at, (p_event).failed_at, (p_event).next_attempt_at,
    (p_lane).leased_through, (p_lane).lease_owner, (p_lane).lease_expires_at, p_relay, p_now
);

COMMENT ON FUNCTION _ledger_claimable(ledger_events, ledger_lanes, text, timestamptz) IS
'Whether one ledger event is claimable by a relay now: pending and due, or leased to it, or its lease expired.';
