-- ack_ledger_runs(): mark delivered what a relay delivered of several
-- runs, and claim the next runs' batches, in one call.
--
-- event_ids may name events of several runs and both lanes. Each run
-- lane's events are acknowledged exactly as ack_ledger(relay, run_id,
-- <its ids>) acknowledges them (an unbroken prefix of the lane's pending
-- tail leased to relay, kind delivered with lag_ms; a repeat after a lost
-- reply answers the same delivered rows and writes nothing), the lanes
-- taken in the lane lock order (run_id COLLATE "C", lane), so two such
-- calls never deadlock. Ids of no event, or not leased to relay, are
-- passed over as ack_ledger passes them. Then, with claim_runs > 0, the
-- next runs' batches of `lane` are claimed as claim_ledger_runs(relay, lane,
-- claim_runs, max_events, lease_seconds, call_id) claims them (a lane whose
-- acknowledgement left events is among the candidates like any other). So a
-- relay delivering runs' short lanes pays one round trip and one commit for
-- many runs, where ack_ledger with claim_next pays them per run.
--
-- Rows: the delivered rows, run by run in the lane lock order, each run's
-- in seq order; then the claim's rows in run_id and seq order. A delivered
-- row is ack_ledger's row without its payload (null): the relay sent that
-- payload, and sending every one back costs the server and, more, the
-- client that parses it (a relay over lanes of 100 parses 100 payloads a
-- batch it never reads). A claimed row carries its payload.
-- Replay: every acknowledgement replays as ack_ledger's does; the claim
-- replays by call_id (pass one: without it a repeat claims afresh, and the
-- leases the lost call took lapse after lease_seconds).
CREATE FUNCTION ack_ledger_runs(
    relay text,
    event_ids bigint[],
    claim_runs integer DEFAULT 0,
    max_events integer DEFAULT 100,
    lease_seconds integer DEFAULT 30,
    lane text DEFAULT 'lifecycle',
    call_id uuid DEFAULT NULL
)
RETURNS SETOF ack_ledger_result
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
    v_lease interval := _lease(ack_ledger_runs.lease_seconds);
    v_group record;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', ack_ledger_runs.relay);
    PERFORM _check_event_ids(ack_ledger_runs.event_ids);
    PERFORM _check_int('claim_runs', ack_ledger_runs.claim_runs, 0, 1000);
    PERFORM _check_int('max_events', ack_ledger_runs.max_events, 1, 1000);
    PERFORM _check_lane(ack_ledger_runs.lane);
    FOR v_group IN
        SELECT l.run_id, array_agg(l.event_id ORDER BY l.seq) AS ids
        FROM ledger_events AS l
        WHERE l.event_id = ANY(ack_ledger_runs.event_ids)
        GROUP BY l.run_id, l.lane
        ORDER BY l.run_id COLLATE "C", l.lane
    LOOP
        RETURN QUERY
        SELECT
            a.kind, a.event_id, a.run_id, a.seq, a.type, NULL::jsonb, a.delivery_key, a.created_at, a.frozen,
            a.lease_expires_at, a.lease_remaining_ms, a.lag_ms
        FROM ack_ledger(
            ack_ledger_runs.relay, v_group.run_id, v_group.ids, 0, ack_ledger_runs.lease_seconds, TRUE
        ) AS a;
    END LOOP;
    IF ack_ledger_runs.claim_runs > 0 THEN
        RETURN QUERY
        SELECT
            c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
            c.lease_expires_at, c.lease_remaining_ms, NULL::bigint
        FROM _claim_ledger_lanes(
            ack_ledger_runs.relay, ack_ledger_runs.lane, NULL, ack_ledger_runs.claim_runs,
            ack_ledger_runs.max_events, v_lease, FALSE, NULL, TRUE, ack_ledger_runs.call_id
        ) AS c
        ORDER BY c.run_id, c.seq;
    END IF;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION ack_ledger_runs(text, bigint[], integer, integer, integer, text, uuid) IS
'Marks delivered what a relay delivered of several runs (each as ack_ledger does) and claims the next runs'' batches.';
