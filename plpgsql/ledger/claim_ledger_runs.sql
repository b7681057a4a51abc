-- claim_ledger_runs(): lease the next deliverable batches of several runs'
-- lanes in one call.
--
-- A run's lifecycle lane usually holds a few events (run.queued,
-- run.started, run.completed), so a relay that claims one run's lane per
-- call pays a round trip and a commit for every run (the commits, which are
-- flushed one by one, are what bounds such a relay). This claims up to
-- max_runs runs' lanes as that many claim_ledger(relay, lane, max_events =>
-- max_events, lease_seconds => lease_seconds, batch => true) discovery calls
-- would, one after another, in one transaction: each run whose lane head has
-- been claimable longest (wake-ups first), its lane row locked SKIP LOCKED
-- (two relays never contend on one run), its prefix claimed as a frozen
-- batch (transport-only heads acknowledged locally, kind local_ack). A run
-- that yields nothing is passed over; at most nine such before the call
-- ends. Rows come in run_id and seq order.
--
-- Replay: with call_id, a repeat of a call that committed answers its local
-- acks and the leases it took that this relay still holds, and does
-- nothing else; otherwise the call works afresh (claim_ledger's replay).
CREATE FUNCTION claim_ledger_runs(
    relay text,
    lane text DEFAULT 'lifecycle',
    max_runs integer DEFAULT 10,
    max_events integer DEFAULT 100,
    lease_seconds integer DEFAULT 30,
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
    v_lease interval := _lease(claim_ledger_runs.lease_seconds);
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', claim_ledger_runs.relay);
    PERFORM _check_lane(claim_ledger_runs.lane);
    PERFORM _check_int('max_runs', claim_ledger_runs.max_runs, 1, 1000);
    PERFORM _check_int('max_events', claim_ledger_runs.max_events, 1, 1000);
    RETURN QUERY
    SELECT c.*
    FROM _claim_ledger_lanes(
        claim_ledger_runs.relay, claim_ledger_runs.lane, NULL, claim_ledger_runs.max_runs,
        claim_ledger_runs.max_events, v_lease, FALSE, NULL, TRUE, claim_ledger_runs.call_id
    ) AS c
    ORDER BY c.run_id, c.seq;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION claim_ledger_runs(text, text, integer, integer, integer, uuid) IS
'Leases the next batches of up to max_runs runs'' ledger lanes to a relay in one call, oldest due first.';
