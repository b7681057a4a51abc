-- Ledger lane bookkeeping on the relay side: the lane locks a relay takes
-- (_lock_event_lanes), where a scan of a lane's tail starts
-- (_lane_scan_from), and recomputing a lane's head and availability
-- (_refresh_lane, _refresh_event_lanes, _lane_recheck). The appender side of
-- the lanes (a written event wakes an empty lane) is _wake_lanes in append.sql;
-- claiming a lane is claim_lane.sql, acknowledging acknowledge.sql.
--
-- Locks (the full order is in custody.sql): a relay locks ledger_lanes rows,
-- waiting, ascending by (run_id COLLATE "C", lane), then the lanes' ledger
-- rows; it never waits for a run row. Appenders hold the run row and never
-- wait for a lane row: they lock only a lane that must change, SKIP LOCKED
-- (append.sql). So an appender and a relay never wait on each other in a
-- cycle, and an open producer transaction never holds up delivery.
--
-- An appender that finds an empty lane locked leaves a wake-up
-- (ledger_wakeups) instead of relying on the lock holder: a holder may roll
-- back, or hold the row without ever refreshing it (a discovery claim whose
-- candidate stopped matching after it was locked). Every scan of a lane's
-- tail starts at _lane_scan_from, which consumes the lane's wake-up.

-- How soon a lane is looked at again when a relay drained it while a writer
-- held its run row (see _refresh_lane): an append that was in flight is
-- claimable this long after it commits, at the latest.
CREATE FUNCTION _lane_recheck()
RETURNS interval
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN interval '200 milliseconds';
END;
$$;

COMMENT ON FUNCTION _lane_recheck() IS
'How soon a lane drained while its run row was busy is looked at again.';

-- Lock the lane rows of the given events, waiting, in the one lane order
-- (run_id COLLATE "C", lane): every relay call that locks several lanes
-- comes through here, so two of them never deadlock, whatever the database's
-- default collation.
CREATE FUNCTION _lock_event_lanes(p_event_ids bigint[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM 1
    FROM ledger_lanes AS ll
    WHERE (ll.run_id, ll.lane) IN (
        SELECT l.run_id, l.lane FROM ledger AS l WHERE l.event_id = ANY(p_event_ids)
    )
    ORDER BY ll.run_id COLLATE "C", ll.lane
    FOR UPDATE OF ll;
END;
$$;

COMMENT ON FUNCTION _lock_event_lanes(bigint[]) IS
'Locks the ledger_lanes rows of the given events in the lane order (run_id COLLATE "C", lane).';

-- Where a scan of a lane's pending tail starts: the recorded head (it only
-- moves forward, and delivered events before it may still have dead entries
-- in ledger_pending_idx until VACUUM, so starting there keeps a scan
-- O(batch), never O(delivered history)), or p_from, a seq no undelivered
-- event precedes -- but no later than the first event of a wake-up an
-- appender left (see ledger_wakeups in schema/06_ledger.sql), which this
-- consumes. The caller holds the lane lock and reads the tail in later
-- statements, which see every event of a wake-up consumed here (it was
-- committed before this statement began).
CREATE FUNCTION _lane_scan_from(p_run_id text, p_lane text, p_from bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_from bigint;
BEGIN
    WITH woken AS (
        DELETE FROM ledger_wakeups AS w
        WHERE w.run_id = p_run_id AND w.lane = p_lane
        RETURNING w.first_seq
    )
    -- Without a head (the lane was empty) no undelivered event precedes the
    -- wake-up's first one: start there, not at 0 (dead index entries).
    SELECT least(
        coalesce(greatest(ll.head_seq, p_from), k.first_seq, 0), k.first_seq
    )
    INTO v_from
    FROM ledger_lanes AS ll
    LEFT JOIN (SELECT min(w.first_seq) AS first_seq FROM woken AS w) AS k ON TRUE
    WHERE ll.run_id = p_run_id AND ll.lane = p_lane;
    RETURN v_from;
END;
$$;

COMMENT ON FUNCTION _lane_scan_from(text, text, bigint) IS
'Where a scan of a lane''s pending tail starts (head, p_from, or an earlier wake-up, which it consumes).';

-- Recompute a lane's head and availability after its events changed. The
-- caller holds the lane row lock; this reads the tail in a fresh snapshot,
-- from the recorded head (or p_from, a seq no undelivered event precedes).
-- Returns the new available_at (NULL: nothing claimable until something
-- happens — empty, or blocked by a failed head). A transport-only head is
-- available like any other, at its due time, successor or not: the claim
-- that comes for it acknowledges it locally, so it never rests as pending.
--
-- Empty is decided only with the run row share-locked: appenders do not lock
-- a lane whose head is live (append.sql), so an append still in flight is
-- invisible here and would be stranded behind an empty lane. The share lock
-- is tried SKIP LOCKED, never waited for: when a writer holds the run row
-- (possibly appending), the lane stays due a moment later (_lane_recheck)
-- with its head where it was, to be looked at again once that writer is
-- done. When the try succeeds, the tail is read again: an append that
-- committed meanwhile is seen, and one that has not started waits for the
-- run row until this transaction ends, then finds the lane empty.
CREATE FUNCTION _refresh_lane(p_run_id text, p_lane text, p_from bigint DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_head ledger;
    v_available timestamptz;
    v_blocked boolean;
    v_from bigint;
    v_run_locked boolean := FALSE;
BEGIN
    v_from := _lane_scan_from(p_run_id, p_lane, p_from);
    LOOP
        v_available := NULL;
        v_blocked := FALSE;
        SELECT l.* INTO v_head
        FROM ledger AS l
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
            AND l.seq >= v_from
        ORDER BY l.seq
        LIMIT 1;
        IF v_head.event_id IS NULL THEN
            v_available := NULL;
        ELSIF v_head.state = 'failed' THEN
            v_blocked := TRUE;
        ELSIF v_head.state = 'leased' THEN
            v_available := v_head.lease_expires_at;
        ELSE
            v_available := v_head.next_attempt_at;
        END IF;
        EXIT WHEN v_head.event_id IS NOT NULL OR v_run_locked;
        -- Empty: only with the run row share-locked (see above).
        PERFORM 1 FROM runs AS r WHERE r.run_id = p_run_id FOR SHARE SKIP LOCKED;
        IF NOT FOUND THEN
            v_available := _clock_now() + _lane_recheck();
            v_head.seq := v_from;
            EXIT;
        END IF;
        v_run_locked := TRUE;
    END LOOP;
    UPDATE ledger_lanes AS ll
    SET head_seq = v_head.seq, available_at = v_available, blocked = v_blocked
    WHERE
        ll.run_id = p_run_id AND ll.lane = p_lane
        AND (
            ll.head_seq IS DISTINCT FROM v_head.seq
            OR ll.available_at IS DISTINCT FROM v_available
            OR ll.blocked IS DISTINCT FROM v_blocked
        );
    RETURN v_available;
END;
$$;

COMMENT ON FUNCTION _refresh_lane(text, text, bigint) IS
'Recomputes a lane''s head and availability from its pending tail (caller holds the lane lock).';

-- Refresh the lanes of the given events (caller holds their lane locks) and
-- wake relays on runrelay_ledger for each one that is claimable now.
CREATE FUNCTION _refresh_event_lanes(p_event_ids bigint[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_lane record;
BEGIN
    FOR v_lane IN
        SELECT DISTINCT l.run_id, l.lane FROM ledger AS l
        WHERE l.event_id = ANY(p_event_ids)
    LOOP
        IF _refresh_lane(v_lane.run_id, v_lane.lane) <= _now() THEN
            PERFORM pg_notify('runrelay_ledger', v_lane.run_id);
        END IF;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION _refresh_event_lanes(bigint[]) IS
'Recomputes the lanes of the given events and notifies runrelay_ledger for those claimable now.';
