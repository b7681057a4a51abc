-- release_ledger(): hand leases back without charging a delivery attempt
-- (a relay shutting down, or giving up a run it cannot serve now). The
-- events become claimable at once; a frozen batch keeps its membership.
-- Returns how many of event_ids were leased to `relay` and released. A
-- lease covers an unbroken run of its lane from the head, so the leased
-- events behind a released one are released with it (_cut_leases). Locks
-- the lane rows in order.
CREATE FUNCTION release_ledger(relay text, event_ids bigint[])
RETURNS integer
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
    v_count integer;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', release_ledger.relay);
    PERFORM _check_event_ids(release_ledger.event_ids);
    PERFORM _lock_event_lanes(release_ledger.event_ids);
    v_count := cardinality(_cut_leases(release_ledger.relay, release_ledger.event_ids));
    PERFORM _refresh_event_lanes(release_ledger.event_ids);
    RETURN _restore_lock_wait(v_caller_lock_timeout, v_count);
END;
$$;

COMMENT ON FUNCTION release_ledger(text, bigint[]) IS
'Hands a relay''s leases back without charging a delivery attempt; returns the number released.';
