-- renew_ledger_lease(): extend the leases a relay still holds, for a slow
-- delivery. Only events leased by `relay` (even if their lease has lapsed but
-- was not taken over) are renewed and returned; others are left alone. A
-- lease is a lane's (its events from the head through leased_through), so
-- renewing any of its events renews all of them. Locks the lane rows in
-- (run_id, lane) order.
CREATE TYPE renew_ledger_lease_result AS (
    event_id bigint,
    lease_expires_at timestamptz
);

CREATE FUNCTION renew_ledger_lease(
    relay text,
    event_ids bigint[],
    lease_seconds integer DEFAULT 30
)
RETURNS SETOF renew_ledger_lease_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_now timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', renew_ledger_lease.relay);
    PERFORM _check_event_ids(renew_ledger_lease.event_ids);
    PERFORM _lock_event_lanes(renew_ledger_lease.event_ids);
    -- From the grant: a renewal that waited for a lane lock keeps its full lease.
    v_now := _clock_now();
    -- The lease lives on the lane (schema/06_ledger.sql): one update per
    -- lane renews every event it covers; the answer names those of
    -- event_ids. A lapsed lease still held by this relay is renewed.
    RETURN QUERY
    WITH renewed AS (
        UPDATE ledger_lanes AS ll
        SET lease_expires_at = v_now + _lease(renew_ledger_lease.lease_seconds)
        FROM (
            SELECT DISTINCT l.run_id, l.lane
            FROM ledger_events AS l
            WHERE l.event_id = ANY(renew_ledger_lease.event_ids)
        ) AS x
        WHERE
            ll.run_id = x.run_id AND ll.lane = x.lane
            AND ll.lease_owner = renew_ledger_lease.relay
        RETURNING ll.run_id, ll.lane, ll.head_seq, ll.leased_through, ll.lease_expires_at
    )
    SELECT l.event_id, r.lease_expires_at
    FROM ledger_events AS l
    INNER JOIN renewed AS r ON l.run_id = r.run_id AND l.lane = r.lane
    WHERE
        l.event_id = ANY(renew_ledger_lease.event_ids)
        AND l.seq >= r.head_seq AND l.seq <= r.leased_through
        AND l.delivered_at IS NULL
    ORDER BY r.run_id COLLATE "C", r.lane, l.seq;
    PERFORM _refresh_event_lanes(renew_ledger_lease.event_ids);
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION renew_ledger_lease(text, bigint[], integer) IS
'Extends the leases a relay still holds on the given events; returns the renewed ones.';
