-- ack_ledger(): mark delivered what a relay delivered, and continue.
--
-- Marks delivered those of event_ids (all of one run and lane) that are
-- leased by `relay`, in seq order and only as an unbroken prefix of the
-- lane's pending tail: an event is never acknowledged while an earlier one is
-- outstanding, so the delivered sequence is always the appended order
-- (kind delivered, lag_ms = delivered_at - created_at). The acknowledgement
-- (_acknowledge) is the one local acks go through too: drop_on_delivery runs
-- lose the payloads, runrelay_delivered is notified naming the last event.
-- With claim_next > 0 the successor prefix is claimed in the same statement
-- (kind claimed, or local_ack with lag_ms for transport-only events, as
-- claim_ledger with run_id and batch), so steady state is one round trip per
-- batch. Locks the lane row (waiting, under a function-local lock_timeout);
-- claimed leases run from the moment they are granted, after that wait.
--
-- Replay: the call tags what it acknowledges and what its claim-next leases
-- or acknowledges locally with an id of its own. A call that finds nothing
-- of event_ids left to acknowledge, but some of them delivered by this relay,
-- is a repeat of the call that delivered them: it answers what that call
-- answered — the delivered events of event_ids (same lag_ms), then that
-- call's local acks and the leases it took that this relay still holds — and
-- writes nothing (no lease is extended, no claim-next runs).
-- The events of event_ids this relay delivered (not acknowledged locally),
-- as ack_ledger reports them, in seq order, read from the ledger view (so
-- only while their lane is current: before this call acknowledges
-- anything): a replay's delivered rows come from here, and a fresh call's
-- earlier ones when some of event_ids were delivered before it (the rows it
-- acknowledges itself come from _acknowledge). PL/pgSQL, so the plan is
-- cached (a SQL function with a SET clause is planned again on every call).
CREATE FUNCTION _ack_ledger_delivered(p_relay text, p_run_id text, p_event_ids bigint[])
RETURNS SETOF ack_ledger_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT x.*
    FROM ledger AS d
    INNER JOIN ledger_events AS l ON l.event_id = d.event_id
    CROSS JOIN LATERAL _ledger_row('delivered', l, d.batch_id, NULL, NULL, d.delivered_at) AS x
    WHERE
        d.event_id = ANY(p_event_ids)
        AND d.run_id = p_run_id
        AND d.delivered_by = p_relay
        AND NOT d.acked_locally
    ORDER BY d.seq;
END;
$$;

COMMENT ON FUNCTION _ack_ledger_delivered(text, text, bigint[]) IS
'The events of event_ids a relay delivered, as ack_ledger reports them (kind delivered, lag_ms).';

-- The lane of event_ids' events of run_id (NULL if none is the run's);
-- 22023 if they are of both lanes.
CREATE FUNCTION _ack_ledger_lane(p_run_id text, p_event_ids bigint[])
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_lane text;
    v_lanes integer;
BEGIN
    SELECT min(l.lane), count(DISTINCT l.lane) INTO v_lane, v_lanes
    FROM ledger_events AS l
    WHERE l.event_id = ANY(p_event_ids) AND l.run_id = p_run_id;
    IF v_lanes > 1 THEN
        PERFORM _invalid('event_ids', 'mixes events of both lanes',
            'Acknowledge each lane''s events in their own call.');
    END IF;
    RETURN v_lane;
END;
$$;

COMMENT ON FUNCTION _ack_ledger_lane(text, bigint[]) IS
'The lane of an ack''s events (22023 if they mix both lanes).';

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
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_now timestamptz;
    v_lane text;
    v_all boolean;
    v_lane_row ledger_lanes;
    v_ack bigint[] := '{}'::bigint[];
    v_last_seq bigint;
    v_from bigint;
    v_call uuid;
    -- When a replay's answer is read, for lease_remaining_ms.
    v_answered timestamptz;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', ack_ledger.relay);
    PERFORM _check_id('run_id', ack_ledger.run_id);
    PERFORM _check_event_ids(ack_ledger.event_ids);
    PERFORM _check_int('claim_next', ack_ledger.claim_next, 0, 1000);
    IF ack_ledger.batch IS NULL THEN
        PERFORM _invalid('batch', 'must not be null', 'Pass true or false.');
    END IF;
    -- The lane is the first event's. That no event of event_ids is of the
    -- other lane is known once all of them are found in this lane's leased
    -- prefix below (the steady state); otherwise it is checked there, with
    -- every id looked up. An unknown first id: every id looked up now.
    SELECT l.lane INTO v_lane
    FROM ledger_events AS l
    WHERE l.event_id = ack_ledger.event_ids[1] AND l.run_id = ack_ledger.run_id;
    IF v_lane IS NULL THEN
        v_lane := coalesce(_ack_ledger_lane(ack_ledger.run_id, ack_ledger.event_ids), 'lifecycle');
    END IF;

    SELECT ll.* INTO v_lane_row
    FROM ledger_lanes AS ll
    WHERE ll.run_id = ack_ledger.run_id AND ll.lane = v_lane
    FOR UPDATE;
    v_from := coalesce(v_lane_row.head_seq, v_lane_row.delivered_below, 0);
    v_now := _now();

    -- The prefix of the pending tail covered by event_ids and leased to us:
    -- the lane's lease is ours and covers it (it runs from the head through
    -- leased_through).
    -- One statement: a running AND in seq order marks the events before the
    -- first one that event_ids does not name or that failed.
    IF v_lane_row.lease_owner = ack_ledger.relay THEN
        SELECT
            coalesce(array_agg(p.event_id ORDER BY p.seq) FILTER (WHERE p.in_prefix), '{}'::bigint[]),
            max(p.seq) FILTER (WHERE p.in_prefix)
        INTO v_ack, v_last_seq
        FROM (
            SELECT
                l.event_id, l.seq,
                bool_and(l.event_id = ANY(ack_ledger.event_ids) AND l.failed_at IS NULL)
                    OVER (ORDER BY l.seq) AS in_prefix
            FROM ledger_events AS l
            WHERE
                l.run_id = ack_ledger.run_id AND l.lane = v_lane AND l.seq >= v_from
                AND l.seq <= v_lane_row.leased_through AND l.delivered_at IS NULL
            ORDER BY l.seq
            LIMIT cardinality(ack_ledger.event_ids)
        ) AS p;
    END IF;
    -- Every id found in the prefix: one lane, and the delivered rows to
    -- report are exactly those acknowledged now.
    v_all := cardinality(v_ack) = cardinality(ack_ledger.event_ids);
    IF NOT v_all THEN
        PERFORM _ack_ledger_lane(ack_ledger.run_id, ack_ledger.event_ids);
    END IF;

    IF cardinality(v_ack) = 0 THEN
        -- Nothing left to acknowledge. If this relay delivered some of
        -- event_ids, this repeats the call that did (the last of them names
        -- it): answer what it answered, and write nothing.
        SELECT d.call_id, d.seq INTO v_call, v_last_seq
        FROM ledger AS d
        WHERE
            d.event_id = ANY(ack_ledger.event_ids)
            AND d.run_id = ack_ledger.run_id
            AND d.delivered_by = ack_ledger.relay
            AND NOT d.acked_locally
        ORDER BY d.seq DESC
        LIMIT 1;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM _ack_ledger_delivered(ack_ledger.relay, ack_ledger.run_id, ack_ledger.event_ids);
            -- Its local acks (on the events), then its lease (on the lane).
            v_answered := _clock_now();
            RETURN QUERY
            SELECT x.*
            FROM ledger_events AS l
            CROSS JOIN LATERAL _ledger_row('local_ack', l, NULL, NULL, v_answered) AS x
            WHERE
                l.local_ack_call_id = v_call
                AND l.run_id = ack_ledger.run_id AND l.lane = v_lane AND l.seq > v_last_seq
                AND l.delivered_by = ack_ledger.relay
            ORDER BY l.seq;
            IF v_lane_row.lease_call_id = v_call AND v_lane_row.lease_owner = ack_ledger.relay THEN
                RETURN QUERY
                SELECT x.*
                FROM ledger_events AS l
                CROSS JOIN LATERAL _ledger_row(
                    'claimed', l, v_lane_row.batch_id, v_lane_row.lease_expires_at, v_answered
                ) AS x
                WHERE
                    l.run_id = ack_ledger.run_id AND l.lane = v_lane AND l.seq >= v_from
                    AND l.seq <= v_lane_row.leased_through AND l.delivered_at IS NULL
                ORDER BY l.seq;
            END IF;
            -- Whoever holds a lane lock refreshes the lane before it commits
            -- (an append that found it locked left it to us); on a lane that
            -- is current this changes nothing.
            PERFORM _refresh_lane(ack_ledger.run_id, v_lane);
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
    END IF;

    v_call := gen_random_uuid();
    IF NOT v_all THEN
        -- First those of event_ids this relay delivered in an earlier call:
        -- they lie below the head, so before the prefix acknowledged now,
        -- and the ledger view reads them while the lane is current.
        RETURN QUERY SELECT * FROM _ack_ledger_delivered(ack_ledger.relay, ack_ledger.run_id, ack_ledger.event_ids);
    END IF;
    RETURN QUERY SELECT * FROM _acknowledge(ack_ledger.run_id, v_ack, ack_ledger.relay, v_now, FALSE, v_call);
    IF cardinality(v_ack) > 0 THEN
        -- The acknowledged events were an unbroken prefix: nothing before them remains.
        v_from := v_last_seq + 1;
    END IF;

    -- Claim next, unless one probe finds nothing after the acknowledged
    -- prefix and no wake-up (the usual end of a run's short lane): then only
    -- the lane is recomputed, which is where _claim_lane would end after
    -- finding no head. An append committed after the probe is the lane's
    -- next head either way, as if it had committed just after _claim_lane
    -- read the tail.
    IF ack_ledger.claim_next > 0 AND (
        NOT _fast_paths()
        OR EXISTS (
            SELECT FROM ledger_events AS l
            WHERE
                l.run_id = ack_ledger.run_id AND l.lane = v_lane AND l.seq >= v_from
                AND l.delivered_at IS NULL
        )
        OR EXISTS (SELECT FROM ledger_wakeups AS w WHERE w.run_id = ack_ledger.run_id AND w.lane = v_lane)
    ) THEN
        RETURN QUERY
        SELECT * FROM _claim_lane(
            ack_ledger.relay, ack_ledger.run_id, v_lane, ack_ledger.claim_next,
            ack_ledger.batch, _lease(ack_ledger.lease_seconds), v_call, NULL, v_from);
    ELSIF ack_ledger.claim_next > 0 THEN
        PERFORM _refresh_lane(ack_ledger.run_id, v_lane, v_from);
    ELSIF _refresh_lane(ack_ledger.run_id, v_lane, v_from) <= v_now THEN
        PERFORM pg_notify(n.channel, ack_ledger.run_id) FROM _notifying('ledger') AS n (channel);
    END IF;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION ack_ledger(text, text, bigint[], integer, integer, boolean) IS
'Marks delivered the leased prefix a relay delivered and, with claim_next, claims the successor prefix in the same statement.';
