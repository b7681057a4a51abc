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
-- Every row leased or acknowledged locally is tagged with p_call_id, which
-- is what claim_ledger and ack_ledger replays look up. Finally the lane's
-- availability is recomputed.
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
    v_head ledger;
    v_target ledger;
    v_event ledger;
    v_local_acks integer := 0;
    v_members bigint[];
    v_batch uuid;
    v_from bigint;
    v_front bigint;
    v_front_ok boolean;
BEGIN
    -- Start at the lane's known head, or an earlier wake-up (_lane_scan_from).
    v_from := _lane_scan_from(p_run_id, p_lane, p_from);

    IF p_expected_head IS NOT NULL THEN
        SELECT l.* INTO v_target
        FROM ledger AS l
        WHERE
            l.event_id = p_expected_head AND l.run_id = p_run_id AND l.lane = p_lane
            AND l.state <> 'delivered' AND l.seq >= v_from;
        -- What lies in front of it must all be due transport-only events,
        -- fewer than the 1000 one call acknowledges locally (which bounds
        -- this scan too).
        SELECT count(*), coalesce(bool_and((f.e).transport_only AND _ledger_claimable(f.e, p_relay, v_now)), TRUE)
        INTO v_front, v_front_ok
        FROM (
            SELECT l AS e
            FROM ledger AS l
            WHERE
                l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
                AND l.seq >= v_from AND l.seq < v_target.seq
            ORDER BY l.seq
            LIMIT 1000
        ) AS f;
        IF v_target.event_id IS NULL OR NOT v_front_ok OR v_front >= 1000
            OR NOT _ledger_claimable(v_target, p_relay, v_now) THEN
            PERFORM _refresh_lane(p_run_id, p_lane, v_from);
            RETURN;
        END IF;
    END IF;

    LOOP
        SELECT l.* INTO v_head
        FROM ledger AS l
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
            AND l.seq >= v_from
        ORDER BY l.seq
        LIMIT 1;
        EXIT WHEN v_head.event_id IS NULL OR NOT _ledger_claimable(v_head, p_relay, v_now);

        IF v_head.batch_id IS NOT NULL THEN
            RETURN QUERY
            WITH released AS (
                UPDATE ledger AS l
                SET state = 'leased',
                    lease_owner = p_relay,
                    lease_expires_at = v_now + p_lease,
                    call_id = coalesce(p_call_id, l.call_id)
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane
                    AND l.batch_id = v_head.batch_id AND l.state IN ('pending', 'leased')
                    -- Never past a member that failed: it blocks what follows.
                    AND l.seq < coalesce((
                        SELECT min(f.seq) FROM ledger AS f
                        WHERE
                            f.run_id = p_run_id AND f.lane = p_lane
                            AND f.batch_id = v_head.batch_id AND f.state = 'failed'
                    ), 9223372036854775807)
                RETURNING l.*
            )
            SELECT x.*
            FROM released AS r
            CROSS JOIN LATERAL _ledger_row('claimed', r::ledger, _clock_now()) AS x
            ORDER BY r.seq;
            EXIT;
        END IF;

        IF v_head.transport_only THEN
            -- The due transport-only run from the head, up to the named event.
            v_members := '{}'::bigint[];
            FOR v_event IN
                SELECT l.*
                FROM ledger AS l
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
                    AND l.seq >= v_head.seq
                ORDER BY l.seq
                LIMIT 1000 - v_local_acks
            LOOP
                EXIT WHEN NOT v_event.transport_only OR NOT _ledger_claimable(v_event, p_relay, v_now);
                v_members := v_members || v_event.event_id;
                v_from := v_event.seq + 1;
                EXIT WHEN v_event.event_id = p_expected_head;
            END LOOP;
            RETURN QUERY
            SELECT x.*
            FROM _acknowledge(p_run_id, v_members, p_relay, v_now, TRUE, p_call_id) AS a
            CROSS JOIN LATERAL _ledger_row('local_ack', a, v_now) AS x
            ORDER BY a.seq;
            v_local_acks := v_local_acks + cardinality(v_members);
            EXIT WHEN v_members[cardinality(v_members)] = p_expected_head OR v_local_acks >= 1000;
            CONTINUE;
        END IF;

        v_members := ARRAY[v_head.event_id];
        IF p_batch AND p_max > 1 THEN
            FOR v_event IN
                SELECT l.*
                FROM ledger AS l
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
                    AND l.seq > v_head.seq
                ORDER BY l.seq
                LIMIT p_max - 1
            LOOP
                EXIT WHEN v_event.transport_only OR v_event.batch_id IS NOT NULL
                    OR NOT _ledger_claimable(v_event, p_relay, v_now);
                v_members := v_members || v_event.event_id;
            END LOOP;
            v_batch := gen_random_uuid();
        END IF;
        RETURN QUERY
        WITH leased AS (
            UPDATE ledger AS l
            SET state = 'leased',
                lease_owner = p_relay,
                lease_expires_at = v_now + p_lease,
                batch_id = v_batch,
                batch_started_at = CASE WHEN v_batch IS NOT NULL THEN v_now END,
                call_id = p_call_id
            WHERE l.event_id = ANY(v_members)
            RETURNING l.*
        )
        SELECT x.*
        FROM leased AS r
        CROSS JOIN LATERAL _ledger_row('claimed', r::ledger, _clock_now()) AS x
        ORDER BY r.seq;
        EXIT;
    END LOOP;
    PERFORM _refresh_lane(p_run_id, p_lane, v_from);
END;
$$;

COMMENT ON FUNCTION _claim_lane(text, text, text, integer, boolean, interval, uuid, bigint, bigint) IS
'Claims one run lane''s head prefix for a relay (caller holds the lane lock); see claim_ledger.';

-- _ledger_claimable(): whether event p_event can be claimed by p_relay at
-- p_now (ignoring order: _claim_lane checks that).
CREATE FUNCTION _ledger_claimable(p_event ledger, p_relay text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_event.state = 'leased' THEN
        RETURN p_event.lease_owner = p_relay OR p_event.lease_expires_at <= p_now;
    END IF;
    RETURN p_event.state = 'pending' AND p_event.next_attempt_at <= p_now;
END;
$$;

COMMENT ON FUNCTION _ledger_claimable(ledger, text, timestamptz) IS
'Whether one ledger event is claimable by a relay now: pending and due, or leased to it, or its lease expired.';
