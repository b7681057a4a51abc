-- Ledger lane bookkeeping.
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

CREATE FUNCTION _check_lane(p_lane text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_lane IS NULL OR p_lane NOT IN ('lifecycle', 'observability') THEN
        PERFORM _invalid('lane', format('unknown lane %s', coalesce(p_lane, 'null')),
            'Pass lifecycle or observability.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_lane(text) IS
'Validates a lane name: lifecycle or observability.';

CREATE FUNCTION _check_event_ids(p_event_ids bigint[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_event_ids IS NULL OR array_ndims(p_event_ids) > 1 OR cardinality(p_event_ids) > 10000 THEN
        PERFORM _invalid('event_ids', 'must be a one-dimensional array of at most 10000 event ids',
            'Pass the event_id values a claim returned.');
    END IF;
    IF array_position(p_event_ids, NULL) IS NOT NULL THEN
        PERFORM _invalid('event_ids', 'must not contain null',
            'Pass the event_id values a claim returned.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_event_ids(bigint[]) IS
'Validates an event_ids argument: not null, no null element, at most 10000 ids.';

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

-- Whether event e can be claimed by p_relay at p_now (ignoring order).
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

-- One ledger event as a claim or acknowledgement reports it: kind, the
-- event, its lease with lease_remaining_ms measured at p_now (pass the clock
-- at the moment of answering, _clock_now()), and for an acknowledged event
-- lag_ms = delivered_at - created_at.
CREATE FUNCTION _ledger_row(p_kind text, p_event ledger, p_now timestamptz)
RETURNS ack_ledger_result
LANGUAGE sql
VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT ROW(
        p_kind, p_event.event_id, p_event.run_id, p_event.seq, p_event.type, p_event.payload,
        p_event.delivery_key, p_event.created_at, p_event.batch_id IS NOT NULL,
        p_event.lease_expires_at,
        CASE
            WHEN p_event.lease_expires_at IS NOT NULL
                THEN floor(extract(EPOCH FROM p_event.lease_expires_at - p_now) * 1000)::bigint
        END,
        CASE
            WHEN p_event.delivered_at IS NOT NULL
                THEN floor(extract(EPOCH FROM p_event.delivered_at - p_event.created_at) * 1000)::bigint
        END
    )::ack_ledger_result;
$$;

COMMENT ON FUNCTION _ledger_row(text, ledger, timestamptz) IS
'Formats one ledger event as a claim/ack row; lease_remaining_ms measured at p_now, lag_ms for acknowledged events.';

-- _acknowledge(): the one acknowledgement path, for the events a relay
-- delivered (ack_ledger) and the transport-only events a claim acknowledges
-- locally (_claim_lane, p_locally). Each event becomes delivered by p_relay
-- at p_now, loses its lease, and is tagged with p_call_id, the call that
-- acknowledged it (what a replay of that call looks up); a drop_on_delivery
-- run loses their payloads; runrelay_delivered is notified once, naming the
-- last event. Precondition: the caller holds the lane lock, and p_event_ids
-- are an unbroken prefix of one run lane's pending tail, in seq order.
-- Returns the acknowledged rows (in no particular order).
CREATE FUNCTION _acknowledge(
    p_run_id text,
    p_event_ids bigint[],
    p_relay text,
    p_now timestamptz,
    p_locally boolean,
    p_call_id uuid
)
RETURNS SETOF ledger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_drop boolean;
BEGIN
    IF coalesce(cardinality(p_event_ids), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT r.payload_retention = 'drop_on_delivery' INTO v_drop
    FROM runs AS r WHERE r.run_id = p_run_id;
    RETURN QUERY
    UPDATE ledger AS l
    SET state = 'delivered',
        delivered_at = p_now,
        delivered_by = p_relay,
        acked_locally = p_locally,
        lease_owner = NULL,
        lease_expires_at = NULL,
        call_id = p_call_id,
        payload = CASE WHEN v_drop THEN NULL ELSE l.payload END
    WHERE l.event_id = ANY(p_event_ids) AND l.run_id = p_run_id
    RETURNING l.*;
    PERFORM pg_notify('runrelay_delivered',
        json_build_object('run_id', p_run_id, 'event_id', p_event_ids[cardinality(p_event_ids)])::text);
END;
$$;

COMMENT ON FUNCTION _acknowledge(text, bigint[], text, timestamptz, boolean, uuid) IS
'Marks a lane prefix delivered (by a relay, or locally if transport-only): retention, call tag, runrelay_delivered.';
