-- release_ledger(): hand leases back without charging a delivery attempt
-- (a relay shutting down, or giving up a run it cannot serve now). The
-- events become claimable at once; a frozen batch keeps its membership.
-- Returns how many leases were released. Locks the lane rows in order.
CREATE FUNCTION release_ledger(relay text, event_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_count integer;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', release_ledger.relay);
    PERFORM _check_event_ids(release_ledger.event_ids);
    PERFORM _lock_event_lanes(release_ledger.event_ids);
    UPDATE ledger AS l
    SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL
    WHERE
        l.event_id = ANY(release_ledger.event_ids)
        -- Leased by this relay: an owner implies state 'leased'
        -- (ledger_leased_has_owner). Testing state itself would let a plan
        -- made with stale statistics walk ledger_pending_idx (state <>
        -- 'delivered') instead of probing the primary key.
        AND l.lease_owner = release_ledger.relay;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM _refresh_event_lanes(release_ledger.event_ids);
    RETURN _restore_lock_wait(v_caller_lock_timeout, v_count);
END;
$$;

COMMENT ON FUNCTION release_ledger(text, bigint[]) IS
'Hands a relay''s leases back without charging a delivery attempt; returns the number released.';
