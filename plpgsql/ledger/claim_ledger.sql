-- claim_ledger(): lease the next deliverable events of one run's lane.
--
-- run_id NULL: discover the run whose lane head has been claimable longest
-- (ledger_lanes by available_at: one row per run lane, never per event),
-- lock its lane row SKIP LOCKED — two relays never contend on one run — and
-- claim its prefix; if that run yields nothing (its head changed since the
-- lane row was written), try the next, up to 10. With run_id: that run only;
-- its lane row is locked SKIP LOCKED, or with wait_for_run waited for under a
-- bounded lock_timeout (55P03 when it lapses).
-- The head blocks everything behind it (failed, not due, leased to another
-- relay); a head leased to this relay is re-claimed with its lease extended,
-- so a retry after a lost reply is safe. A due transport-only head is
-- acknowledged locally (kind local_ack) whether or not anything follows it,
-- so a claim may answer local acks only. expected_head claims the named
-- event only: it must be the head or lie behind nothing but due
-- transport-only events (acknowledged locally on the way); naming a
-- transport-only event acknowledges exactly it. See _claim_lane for the
-- details and frozen batches (batch => true).
-- Replay: with call_id, if an earlier call with that id committed, its local
-- acks come back as local_ack and its still-held leases as claimed, and
-- nothing else is done; otherwise the call works afresh. A lease is found
-- on its lane row (ledger_lanes.lease_call_id), local acks on the events.
-- The claim itself is _claim_ledger_lanes (_internal/claim_ledger_lanes.sql),
-- which claim_ledger_runs shares.
-- Leases run from the moment they are granted (after the lane lock is held,
-- so a lock wait does not shorten them); lease_remaining_ms is measured when
-- the call answers, so a relay can prove its fresh lease still covers its
-- first delivery and schedule the first renewal from it.
CREATE FUNCTION claim_ledger(
    relay text,
    lane text DEFAULT 'lifecycle',
    run_id text DEFAULT NULL,
    max_events integer DEFAULT 1,
    lease_seconds integer DEFAULT 30,
    wait_for_run boolean DEFAULT FALSE,
    expected_head bigint DEFAULT NULL,
    batch boolean DEFAULT FALSE,
    call_id uuid DEFAULT NULL
)
RETURNS SETOF claim_ledger_result
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
    v_lease interval := _lease(claim_ledger.lease_seconds);
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', claim_ledger.relay);
    PERFORM _check_lane(claim_ledger.lane);
    PERFORM _check_id('run_id', claim_ledger.run_id, TRUE);
    PERFORM _check_int('max_events', claim_ledger.max_events, 1, 1000);
    IF claim_ledger.wait_for_run IS NULL OR claim_ledger.batch IS NULL THEN
        PERFORM _invalid(CASE WHEN claim_ledger.batch IS NULL THEN 'batch' ELSE 'wait_for_run' END,
            'must not be null', 'Pass true or false.');
    END IF;
    RETURN QUERY
    SELECT * FROM _claim_ledger_lanes(
        claim_ledger.relay, claim_ledger.lane, claim_ledger.run_id, 1, claim_ledger.max_events, v_lease,
        claim_ledger.wait_for_run, claim_ledger.expected_head, claim_ledger.batch, claim_ledger.call_id
    );
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION claim_ledger(text, text, text, integer, integer, boolean, bigint, boolean, uuid) IS
'Leases the head (or a frozen batch) of a run''s ledger lane to a relay, discovering the oldest due run when run_id is null.';
