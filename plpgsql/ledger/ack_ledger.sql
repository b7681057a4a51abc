-- ack_ledger(): mark delivered what a relay delivered, and continue.
--
-- Marks delivered those of event_ids (all of one run and lane) that are
-- leased by `relay`, in seq order and only as an unbroken prefix of the
-- lane's pending tail: an event is never acknowledged while an earlier one is
-- outstanding, so the delivered sequence is always the appended order
-- (kind delivered, lag_ms = delivered_at - created_at). drop_on_delivery runs
-- lose the payloads of delivered events. Notifies runrelay_delivered once
-- per call with the last event acknowledged. With claim_next > 0 the
-- successor prefix is claimed in the same statement (kind claimed/local_ack,
-- as claim_ledger with run_id, batch), so steady state is one round trip per
-- batch. Locks the lane row (waiting). Replay: events of event_ids this relay
-- already delivered are reported as delivered again with the same lag_ms, and
-- the successor prefix, still leased to this relay, is returned again.
CREATE TYPE ack_ledger_result AS (
    kind text,
    event_id bigint,
    run_id text,
    seq bigint,
    type text,
    payload jsonb,
    delivery_key text,
    created_at timestamptz,
    frozen boolean,
    lease_expires_at timestamptz,
    lease_remaining_ms bigint,
    lag_ms bigint
);

CREATE FUNCTION ack_ledger(
    relay text,
    run_id text,
    event_ids bigint[],
    claim_next integer DEFAULT 0,
    lease_seconds integer DEFAULT 30,
    batch boolean DEFAULT FALSE
)
RETURNS SETOF ack_ledger_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '10s'
AS $$
DECLARE
    v_now timestamptz;
    v_lane text;
    v_lanes integer;
    v_event ledger;
    v_ack bigint[] := '{}'::bigint[];
    v_drop boolean;
    v_last bigint;
    v_last_seq bigint;
    v_from bigint;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', ack_ledger.relay);
    PERFORM _check_id('run_id', ack_ledger.run_id);
    PERFORM _check_event_ids(ack_ledger.event_ids);
    PERFORM _check_int('claim_next', ack_ledger.claim_next, 0, 1000);
    IF ack_ledger.batch IS NULL THEN
        PERFORM _invalid('batch', 'must not be null', 'Pass true or false.');
    END IF;
    SELECT min(l.lane), count(DISTINCT l.lane) INTO v_lane, v_lanes
    FROM ledger AS l
    WHERE l.event_id = ANY(ack_ledger.event_ids) AND l.run_id = ack_ledger.run_id;
    IF v_lanes > 1 THEN
        PERFORM _invalid('event_ids', 'mixes events of both lanes',
            'Acknowledge each lane''s events in their own call.');
    END IF;
    v_lane := coalesce(v_lane, 'lifecycle');

    SELECT coalesce(ll.head_seq, 0) INTO v_from
    FROM ledger_lanes AS ll
    WHERE ll.run_id = ack_ledger.run_id AND ll.lane = v_lane
    FOR UPDATE;
    v_now := _now();

    -- The prefix of the pending tail covered by event_ids and leased to us.
    FOR v_event IN
        SELECT l.*
        FROM ledger AS l
        WHERE
            l.run_id = ack_ledger.run_id AND l.lane = v_lane AND l.state <> 'delivered'
            AND l.seq >= v_from
        ORDER BY l.seq
        LIMIT cardinality(ack_ledger.event_ids)
    LOOP
        EXIT WHEN NOT (v_event.event_id = ANY(ack_ledger.event_ids))
            OR v_event.state <> 'leased' OR v_event.lease_owner <> ack_ledger.relay;
        v_ack := v_ack || v_event.event_id;
        v_last_seq := v_event.seq;
    END LOOP;

    IF cardinality(v_ack) > 0 THEN
        SELECT r.payload_retention = 'drop_on_delivery' INTO v_drop
        FROM runs AS r WHERE r.run_id = ack_ledger.run_id;
        UPDATE ledger AS l
        SET state = 'delivered',
            delivered_at = v_now,
            delivered_by = ack_ledger.relay,
            lease_owner = NULL,
            lease_expires_at = NULL,
            payload = CASE WHEN v_drop THEN NULL ELSE l.payload END
        WHERE l.event_id = ANY(v_ack);
        v_last := v_ack[cardinality(v_ack)];
        -- The acknowledged events were an unbroken prefix: nothing before them remains.
        v_from := v_last_seq + 1;
        PERFORM pg_notify('runrelay_delivered',
            json_build_object('run_id', ack_ledger.run_id, 'event_id', v_last)::text);
    END IF;

    RETURN QUERY
    SELECT
        'delivered'::text, l.event_id, l.run_id, l.seq, l.type, l.payload, l.delivery_key,
        l.created_at, l.batch_id IS NOT NULL, NULL::timestamptz, NULL::bigint,
        floor(extract(EPOCH FROM l.delivered_at - l.created_at) * 1000)::bigint
    FROM ledger AS l
    WHERE
        l.event_id = ANY(ack_ledger.event_ids)
        AND l.run_id = ack_ledger.run_id
        -- delivered_at, not state: equivalent by CHECK, but it keeps the
        -- planner off ledger_delivered_idx (a scan of the delivered history).
        AND l.delivered_at IS NOT NULL
        AND l.delivered_by = ack_ledger.relay
        AND NOT l.acked_locally
    ORDER BY l.seq;

    IF ack_ledger.claim_next > 0 THEN
        RETURN QUERY
        SELECT c.*, NULL::bigint
        FROM _claim_lane(
            ack_ledger.relay, ack_ledger.run_id, v_lane, ack_ledger.claim_next,
            ack_ledger.batch, _lease(ack_ledger.lease_seconds), NULL, NULL, v_from) AS c;
    ELSIF _refresh_lane(ack_ledger.run_id, v_lane, v_from) <= v_now THEN
        PERFORM pg_notify('runrelay_ledger', ack_ledger.run_id);
    END IF;
END;
$$;

COMMENT ON FUNCTION ack_ledger(text, text, bigint[], integer, integer, boolean) IS
'Marks delivered the leased prefix a relay delivered and, with claim_next, claims the successor prefix in the same statement.';
