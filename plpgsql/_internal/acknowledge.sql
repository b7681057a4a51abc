-- _acknowledge(): the one acknowledgement path, for the events a relay
-- delivered (ack_ledger) and the transport-only events a claim acknowledges
-- locally (_claim_lane, p_locally). The events become delivered by p_relay
-- at p_now, acknowledged by the call p_call_id (what a replay of that call
-- looks up); an event of the lane's frozen batch keeps that batch (the lane
-- holds it only while the batch is undelivered); a drop_on_delivery run
-- loses their payloads; runrelay_delivered is notified once, naming the last
-- event.
--
-- A relay's delivery writes one ledger_deliveries row for the whole prefix
-- (schema/06_ledger.sql), and no event row unless payloads are dropped. A
-- local acknowledgement is written on the events themselves (a claim's
-- replay finds them by local_ack_call_id); it is rare, and each is one
-- event or a short run of them. The lease needs no clearing: it lives on the
-- lane, and covers only events at or after the head, which the caller's
-- refresh moves past these.
--
-- Precondition: the caller holds the lane lock, and p_event_ids are an
-- unbroken prefix of one run lane's pending tail, in seq order (so the
-- prefix is exactly the lane's events from the first to the last of them).
-- Returns the acknowledged events as ack_ledger reports them, kind
-- delivered (or local_ack when p_locally), in seq order.
CREATE FUNCTION _acknowledge(
    p_run_id text,
    p_event_ids bigint[],
    p_relay text,
    p_now timestamptz,
    p_locally boolean,
    p_call_id uuid
)
RETURNS SETOF ack_ledger_result
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
    IF p_locally THEN
        RETURN QUERY
        WITH acked AS (
            UPDATE ledger_events AS l
            SET delivered_at = p_now,
                delivered_by = p_relay,
                acked_locally = TRUE,
                call_id = p_call_id,
                local_ack_call_id = p_call_id,
                batch_id = CASE WHEN l.seq <= v_batch_through THEN v_batch_id END,
                batch_started_at = CASE WHEN l.seq <= v_batch_through THEN v_batch_started_at END,
                payload = CASE WHEN v_drop THEN NULL ELSE l.payload END
            WHERE
                l.run_id = p_run_id AND l.lane = v_lane AND l.seq >= v_first AND l.seq <= v_last
                AND l.event_id = ANY(p_event_ids)
            RETURNING l AS e
        )
        SELECT x.*
        FROM acked AS a
        CROSS JOIN LATERAL _ledger_row('local_ack', a.e, NULL, NULL, p_now) AS x
        ORDER BY (a.e).seq;
    ELSE
        INSERT INTO ledger_deliveries (
            run_id, lane, first_seq, last_seq, delivered_at, delivered_by, call_id,
            batch_id, batch_started_at, batch_through
        )
        SELECT
            p_run_id, v_lane, v_first, v_last, p_now, p_relay, p_call_id,
            CASE WHEN v_first <= v_batch_through THEN v_batch_id END,
            CASE WHEN v_first <= v_batch_through THEN v_batch_started_at END,
            CASE WHEN v_first <= v_batch_through THEN v_batch_through END;
        IF v_drop THEN
            UPDATE ledger_events AS l
            SET payload = NULL
            WHERE l.run_id = p_run_id AND l.lane = v_lane AND l.seq >= v_first AND l.seq <= v_last;
        END IF;
        RETURN QUERY
        SELECT x.*
        FROM ledger_events AS l
        CROSS JOIN LATERAL _ledger_row(
            'delivered', l, CASE WHEN l.seq <= v_batch_through THEN v_batch_id END, NULL, NULL, p_now
        ) AS x
        WHERE l.run_id = p_run_id AND l.lane = v_lane AND l.seq >= v_first AND l.seq <= v_last
        ORDER BY l.seq;
    END IF;
    PERFORM pg_notify(n.channel,
        json_build_object('run_id', p_run_id, 'event_id', p_event_ids[cardinality(p_event_ids)])::text)
    FROM _notifying('delivered') AS n (channel);
END;
$$;

COMMENT ON FUNCTION _acknowledge(text, bigint[], text, timestamptz, boolean, uuid) IS
'Marks a lane prefix delivered (by a relay, one delivery row; or locally if transport-only): retention, call tag, runrelay_delivered.';
