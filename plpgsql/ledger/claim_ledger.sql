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
    v_now timestamptz;
    v_lease interval := _lease(claim_ledger.lease_seconds);
    v_run_id text;
    v_visited text[] := '{}'::text[];
    v_count integer;
    -- When a replay's answer is read, for lease_remaining_ms.
    v_answered timestamptz;
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
    v_now := _now();

    IF claim_ledger.call_id IS NOT NULL THEN
        -- Its local acks (tagged on the events), then the lease it took
        -- (on the lane), while this relay still holds it.
        v_answered := _clock_now();
        RETURN QUERY
        SELECT
            c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
            c.lease_expires_at, c.lease_remaining_ms
        FROM (
            SELECT l, NULL::uuid AS batch_id, NULL::timestamptz AS lease_expires_at
            FROM ledger_events AS l
            WHERE
                l.local_ack_call_id = claim_ledger.call_id
                AND l.delivered_by = claim_ledger.relay
            UNION ALL
            SELECT l, ll.batch_id, ll.lease_expires_at
            FROM ledger_lanes AS ll
            INNER JOIN ledger_events AS l
                ON
                    ll.run_id = l.run_id AND ll.lane = l.lane
                    AND l.seq >= ll.head_seq AND l.seq <= ll.leased_through
            WHERE
                ll.lease_call_id = claim_ledger.call_id
                AND ll.lease_owner = claim_ledger.relay
                AND l.delivered_at IS NULL
        ) AS r
        CROSS JOIN LATERAL _ledger_row(
            CASE WHEN (r.l).acked_locally THEN 'local_ack' ELSE 'claimed' END, r.l, r.batch_id,
            r.lease_expires_at, v_answered
        ) AS c
        ORDER BY c.run_id, c.seq;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count > 0 THEN
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
    END IF;

    IF claim_ledger.run_id IS NOT NULL THEN
        IF claim_ledger.wait_for_run THEN
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE ll.run_id = claim_ledger.run_id AND ll.lane = claim_ledger.lane
            FOR UPDATE;
        ELSE
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE ll.run_id = claim_ledger.run_id AND ll.lane = claim_ledger.lane
            FOR UPDATE SKIP LOCKED;
        END IF;
        IF v_run_id IS NOT NULL THEN
            RETURN QUERY
            SELECT
                c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
                c.lease_expires_at, c.lease_remaining_ms
            FROM _claim_lane(
                claim_ledger.relay, v_run_id, claim_ledger.lane, claim_ledger.max_events,
                claim_ledger.batch, v_lease, claim_ledger.call_id, claim_ledger.expected_head) AS c;
        END IF;
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;

    FOR v_count IN 1 .. 10 LOOP
        -- A lane with a wake-up first: its lane row does not say it is due
        -- (an appender found it held by a relay; see append.sql).
        SELECT ll.run_id INTO v_run_id
        FROM ledger_wakeups AS w
        INNER JOIN ledger_lanes AS ll ON w.run_id = ll.run_id AND w.lane = ll.lane
        WHERE w.lane = claim_ledger.lane AND w.run_id <> ALL(v_visited)
        ORDER BY w.created_at
        LIMIT 1
        FOR UPDATE OF ll SKIP LOCKED;
        IF v_run_id IS NULL THEN
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE
                ll.lane = claim_ledger.lane
                AND ll.available_at <= v_now
                AND ll.run_id <> ALL(v_visited)
            ORDER BY ll.available_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
        END IF;
        EXIT WHEN v_run_id IS NULL;
        v_visited := v_visited || v_run_id;
        RETURN QUERY
        SELECT
            c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
            c.lease_expires_at, c.lease_remaining_ms
        FROM _claim_lane(
            claim_ledger.relay, v_run_id, claim_ledger.lane, claim_ledger.max_events,
            claim_ledger.batch, v_lease, claim_ledger.call_id, claim_ledger.expected_head) AS c;
        IF FOUND THEN
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
        v_run_id := NULL;
    END LOOP;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION claim_ledger(text, text, text, integer, integer, boolean, bigint, boolean, uuid) IS
'Leases the head (or a frozen batch) of a run''s ledger lane to a relay, discovering the oldest due run when run_id is null.';
