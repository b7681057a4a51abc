-- renew_ledger_lease(): extend the leases a relay still holds, for a slow
-- delivery. Only events leased by `relay` (even if their lease has lapsed but
-- was not taken over) are renewed and returned; others are left alone. Locks
-- the lane rows in (run_id, lane) order.
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
    RETURN QUERY
    UPDATE ledger AS l
    SET lease_expires_at = v_now + _lease(renew_ledger_lease.lease_seconds)
    WHERE
        l.event_id = ANY(renew_ledger_lease.event_ids)
        -- Leased by this relay: an owner implies state 'leased'
        -- (ledger_leased_has_owner). Testing state itself would let a plan
        -- made with stale statistics walk ledger_pending_idx (state <>
        -- 'delivered') instead of probing the primary key.
        AND l.lease_owner = renew_ledger_lease.relay
    RETURNING l.event_id, l.lease_expires_at;
    PERFORM _refresh_event_lanes(renew_ledger_lease.event_ids);
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION renew_ledger_lease(text, bigint[], integer) IS
'Extends the leases a relay still holds on the given events; returns the renewed ones.';
