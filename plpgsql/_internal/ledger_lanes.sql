-- Ledger lane bookkeeping on the relay side: the lane locks a relay takes
-- (_lock_event_lanes), where a scan of a lane's tail starts
-- (_lane_scan_from), and recomputing a lane's head and availability
-- (_refresh_lane, _refresh_event_lanes, _lane_recheck). The appender side of
-- the lanes (a written event wakes an empty lane) is _lanes_on_write in append.sql;
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
        SELECT l.run_id, l.lane FROM ledger_events AS l WHERE l.event_id = ANY(p_event_ids)
    )
    ORDER BY ll.run_id COLLATE "C", ll.lane
    FOR UPDATE OF ll;
END;
$$;

COMMENT ON FUNCTION _lock_event_lanes(bigint[]) IS
'Locks the ledger_lanes rows of the given events in the lane order (run_id COLLATE "C", lane).';

-- Where a scan of a lane's pending tail starts: the recorded head (it only
-- moves forward, and every event before it is delivered and still in
-- ledger_lane_seq_idx until pruned, so starting there keeps a scan O(batch),
-- never O(delivered history)), delivered_below for a lane with no head, or
-- p_from, a seq no undelivered event precedes -- but no later than the
-- first event of a wake-up an
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
    -- Without a head (the lane was empty) every event below delivered_below
    -- is delivered, and no undelivered event precedes the wake-up's first one.
    SELECT least(
        greatest(coalesce(ll.head_seq, ll.delivered_below), p_from), k.first_seq
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
--
-- The lease and the frozen batch (schema/06_ledger.sql) end here when the
-- head has passed their last event: a lane row never carries a lease or a
-- batch that covers no undelivered event.
CREATE FUNCTION _refresh_lane(p_run_id text, p_lane text, p_from bigint DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_head ledger_events;
    v_lane ledger_lanes;
    v_available timestamptz;
    v_blocked boolean;
    v_from bigint;
    v_run_locked boolean := FALSE;
BEGIN
    v_from := _lane_scan_from(p_run_id, p_lane, p_from);
    SELECT ll.* INTO v_lane FROM ledger_lanes AS ll WHERE ll.run_id = p_run_id AND ll.lane = p_lane;
    LOOP
        v_available := NULL;
        v_blocked := FALSE;
        SELECT l.* INTO v_head
        FROM ledger_events AS l
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane AND l.seq >= v_from
            AND l.delivered_at IS NULL
        ORDER BY l.seq
        LIMIT 1;
        IF v_head.event_id IS NULL THEN
            v_available := NULL;
        ELSIF v_head.failed_at IS NOT NULL THEN
            v_blocked := TRUE;
        ELSIF v_head.seq <= v_lane.leased_through THEN
            v_available := v_lane.lease_expires_at;
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
    -- Past the lease's or the batch's last event (or nothing pending): it ended.
    IF NOT coalesce(v_head.seq <= v_lane.leased_through, FALSE) THEN
        v_lane.lease_owner := NULL;
        v_lane.lease_expires_at := NULL;
        v_lane.leased_through := NULL;
        v_lane.lease_call_id := NULL;
    END IF;
    IF NOT coalesce(v_head.seq <= v_lane.batch_through, FALSE) THEN
        v_lane.batch_id := NULL;
        v_lane.batch_started_at := NULL;
        v_lane.batch_through := NULL;
    END IF;
    UPDATE ledger_lanes AS ll
    SET head_seq = v_head.seq,
        available_at = v_available,
        blocked = v_blocked,
        delivered_below = coalesce(v_head.seq, greatest(ll.delivered_below, v_from)),
        lease_owner = v_lane.lease_owner,
        lease_expires_at = v_lane.lease_expires_at,
        leased_through = v_lane.leased_through,
        lease_call_id = v_lane.lease_call_id,
        batch_id = v_lane.batch_id,
        batch_started_at = v_lane.batch_started_at,
        batch_through = v_lane.batch_through
    WHERE
        ll.run_id = p_run_id AND ll.lane = p_lane
        AND (
            ll.head_seq IS DISTINCT FROM v_head.seq
            OR ll.available_at IS DISTINCT FROM v_available
            OR ll.blocked IS DISTINCT FROM v_blocked
            OR ll.delivered_below IS DISTINCT FROM coalesce(v_head.seq, greatest(ll.delivered_below, v_from))
            OR ll.leased_through IS DISTINCT FROM v_lane.leased_through
            OR ll.lease_call_id IS DISTINCT FROM v_lane.lease_call_id
            OR ll.batch_through IS DISTINCT FROM v_lane.batch_through
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
        SELECT DISTINCT l.run_id, l.lane FROM ledger_events AS l
        WHERE l.event_id = ANY(p_event_ids)
    LOOP
        IF _refresh_lane(v_lane.run_id, v_lane.lane) <= _now() THEN
            PERFORM pg_notify(n.channel, v_lane.run_id) FROM _notifying('ledger') AS n (channel);
        END IF;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION _refresh_event_lanes(bigint[]) IS
'Recomputes the lanes of the given events and notifies runrelay_ledger for those claimable now.';

-- _cut_leases(): the lease side of release_ledger and fail_ledger. Of
-- p_event_ids, the events inside a lease p_relay holds (undelivered, not
-- failed, at most their lane's leased_through; a lapsed lease nobody took
-- over included); each such lane's lease is cut back to end before the
-- first of them, and ends when that is the head. A lease covers an unbroken
-- run of its lane from the head (schema/06_ledger.sql), so the leased
-- events behind a released or failed one go back with it, uncharged: none
-- of them could be acknowledged before it anyway. The frozen batch is
-- untouched. The caller holds the lane locks and refreshes the lanes.
-- Returns the leased events of p_event_ids, in the lane order, then seq.
CREATE FUNCTION _cut_leases(p_relay text, p_event_ids bigint[])
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH leased AS (
        SELECT e.event_id, e.run_id, e.lane, e.seq
        FROM ledger_events AS e
        INNER JOIN ledger_lanes AS ll ON e.run_id = ll.run_id AND e.lane = ll.lane
        WHERE
            e.event_id = ANY(p_event_ids)
            AND ll.lease_owner = p_relay
            AND e.seq >= ll.head_seq AND e.seq <= ll.leased_through
            AND e.delivered_at IS NULL AND e.failed_at IS NULL
    ),
    -- Runs to completion though nothing reads it (a data-modifying CTE).
    cut AS (
        UPDATE ledger_lanes AS ll
        SET lease_owner = CASE WHEN c.first_seq > ll.head_seq THEN ll.lease_owner END,
            lease_expires_at = CASE WHEN c.first_seq > ll.head_seq THEN ll.lease_expires_at END,
            leased_through = CASE WHEN c.first_seq > ll.head_seq THEN c.first_seq - 1 END,
            lease_call_id = CASE WHEN c.first_seq > ll.head_seq THEN ll.lease_call_id END
        FROM (
            SELECT x.run_id, x.lane, min(x.seq) AS first_seq
            FROM leased AS x
            GROUP BY x.run_id, x.lane
        ) AS c
        WHERE ll.run_id = c.run_id AND ll.lane = c.lane
    )
    SELECT coalesce(array_agg(x.event_id ORDER BY x.run_id COLLATE "C", x.lane, x.seq), '{}'::bigint[])
    INTO v_ids
    FROM leased AS x;
    RETURN v_ids;
END;
$$;

COMMENT ON FUNCTION _cut_leases(text, bigint[]) IS
'Ends a relay''s leases from the first of the given events it leases on; returns those events.';

-- Whether a run's ledger has an event not delivered yet (pending, leased or
-- failed): a lane with a head, or a wake-up an appender left for a lane a
-- relay held (append.sql). Two probes by the run's key. Read in the
-- caller's statement's snapshot; purge_runs calls it again under the run's
-- row lock, when no append can be in flight.
CREATE FUNCTION _ledger_undelivered(p_run_id text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM ledger_lanes AS ll WHERE ll.run_id = p_run_id AND ll.head_seq IS NOT NULL)
        OR EXISTS (SELECT FROM ledger_wakeups AS w WHERE w.run_id = p_run_id);
END;
$$;

COMMENT ON FUNCTION _ledger_undelivered(text) IS
'Whether a run''s ledger has an event not delivered yet: a lane with a head, or a wake-up.';
