-- _acknowledge(): the one acknowledgement path, for the events a relay
-- delivered (ack_ledger) and the transport-only events a claim acknowledges
-- locally (_claim_lane, p_locally). Each event becomes delivered by p_relay
-- at p_now and is tagged with p_call_id, the call that acknowledged it (what
-- a replay of that call looks up; a local acknowledgement also in
-- local_ack_call_id, the column claim replays find it by); an event of the
-- lane's frozen batch keeps that batch (batch_id, batch_started_at: the lane
-- holds them only while the batch is undelivered); a drop_on_delivery run
-- loses their payloads; runrelay_delivered is notified once, naming the last
-- event. No column this writes is indexed or in an index predicate, so the
-- update is HOT (schema/06_ledger.sql). The lease needs no clearing: it
-- lives on the lane, and covers only events at or after the head, which the
-- caller's refresh moves past these. Precondition: the caller holds the lane
-- lock, and p_event_ids are an unbroken prefix of one run lane's pending
-- tail, in seq order. Returns the acknowledged rows (in no particular order).
CREATE FUNCTION _acknowledge(
    p_run_id text,
    p_event_ids bigint[],
    p_relay text,
    p_now timestamptz,
    p_locally boolean,
    p_call_id uuid
)
RETURNS SETOF ledger_events
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_drop boolean;
    v_lane text;
    v_batch_id uuid;
    v_batch_started_at timestamptz;
    v_batch_through bigint;
    v_first bigint;
    v_last bigint;
BEGIN
    IF coalesce(cardinality(p_event_ids), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT
        r.payload_retention = 'drop_on_delivery', ll.lane, ll.batch_id, ll.batch_started_at, ll.batch_through,
        f.seq, t.seq
    INTO v_drop, v_lane, v_batch_id, v_batch_started_at, v_batch_through, v_first, v_last
    FROM runs AS r
    INNER JOIN ledger_events AS f ON f.event_id = p_event_ids[1] AND f.run_id = r.run_id
    INNER JOIN ledger_events AS t ON t.event_id = p_event_ids[cardinality(p_event_ids)] AND t.run_id = r.run_id
    INNER JOIN ledger_lanes AS ll ON ll.run_id = f.run_id AND ll.lane = f.lane
    WHERE r.run_id = p_run_id;
    RETURN QUERY
    UPDATE ledger_events AS l
    SET delivered_at = p_now,
        delivered_by = p_relay,
        acked_locally = p_locally,
        call_id = p_call_id,
        local_ack_call_id = CASE WHEN p_locally THEN p_call_id END,
        batch_id = CASE WHEN l.seq <= v_batch_through THEN v_batch_id END,
        batch_started_at = CASE WHEN l.seq <= v_batch_through THEN v_batch_started_at END,
        payload = CASE WHEN v_drop THEN NULL ELSE l.payload END
    WHERE
        l.run_id = p_run_id AND l.lane = v_lane AND l.seq >= v_first AND l.seq <= v_last
        AND l.event_id = ANY(p_event_ids)
    RETURNING l.*;
    PERFORM pg_notify(n.channel,
        json_build_object('run_id', p_run_id, 'event_id', p_event_ids[cardinality(p_event_ids)])::text)
    FROM _notifying('delivered') AS n (channel);
END;
$$;

COMMENT ON FUNCTION _acknowledge(text, bigint[], text, timestamptz, boolean, uuid) IS
'Marks a lane prefix delivered (by a relay, or locally if transport-only): retention, call tag, runrelay_delivered.';
