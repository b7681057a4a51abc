-- _claim_ledger_lanes(): the claim behind claim_ledger and
-- claim_ledger_runs (and ack_ledger_runs' claim of the next runs), after
-- their validation, under their lock-wait bound: p_lease as _lease returns
-- it. What it does is described at claim_ledger (ledger/claim_ledger.sql);
-- p_runs is how many runs' lanes a discovery (p_run_id null) claims: it
-- goes on discovering until that many runs yielded rows, trying at most
-- nine runs that yield nothing besides.
--
-- Replay: with p_call_id, if an earlier call with that id committed, its
-- local acks come back as local_ack and its still-held leases as claimed
-- (every lane it leased, in run_id and seq order), and nothing else is done;
-- otherwise the call works afresh.
CREATE FUNCTION _claim_ledger_lanes(
    p_relay text,
    p_lane text,
    p_run_id text,
    p_runs integer,
    p_max_events integer,
    p_lease interval,
    p_wait_for_run boolean,
    p_expected_head bigint,
    p_batch boolean,
    p_call_id uuid
)
RETURNS SETOF claim_ledger_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_run_id text;
    v_visited text[] := '{}'::text[];
    v_count integer;
    v_claimed integer := 0;
    -- When a replay's answer is read, for lease_remaining_ms.
    v_answered timestamptz;
BEGIN
    IF p_call_id IS NOT NULL THEN
        -- Its local acks (tagged on the events), then the leases it took
        -- (on the lanes), while this relay still holds them.
        v_answered := _clock_now();
        RETURN QUERY
        SELECT
            c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
            c.lease_expires_at, c.lease_remaining_ms
        FROM (
            SELECT l, NULL::uuid AS batch_id, NULL::timestamptz AS lease_expires_at
            FROM ledger_events AS l
            WHERE
                l.local_ack_call_id = p_call_id
                AND l.delivered_by = p_relay
            UNION ALL
            SELECT l, ll.batch_id, ll.lease_expires_at
            FROM ledger_lanes AS ll
            INNER JOIN ledger_events AS l
                ON
                    ll.run_id = l.run_id AND ll.lane = l.lane
                    AND l.seq >= ll.head_seq AND l.seq <= ll.leased_through
            WHERE
                ll.lease_call_id = p_call_id
                AND ll.lease_owner = p_relay
                AND l.delivered_at IS NULL
        ) AS r
        CROSS JOIN LATERAL _ledger_row(
            CASE WHEN (r.l).acked_locally THEN 'local_ack' ELSE 'claimed' END, r.l, r.batch_id,
            r.lease_expires_at, v_answered
        ) AS c
        ORDER BY c.run_id, c.seq;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count > 0 THEN
            RETURN;
        END IF;
    END IF;

    IF p_run_id IS NOT NULL THEN
        IF p_wait_for_run THEN
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE ll.run_id = p_run_id AND ll.lane = p_lane
            FOR UPDATE;
        ELSE
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE ll.run_id = p_run_id AND ll.lane = p_lane
            FOR UPDATE SKIP LOCKED;
        END IF;
        IF v_run_id IS NOT NULL THEN
            RETURN QUERY
            SELECT
                c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
                c.lease_expires_at, c.lease_remaining_ms
            FROM _claim_lane(
                p_relay, v_run_id, p_lane, p_max_events, p_batch, p_lease, p_call_id, p_expected_head
            ) AS c;
        END IF;
        RETURN;
    END IF;

    FOR v_count IN 1 .. p_runs + 9 LOOP
        -- A lane with a wake-up first: its lane row does not say it is due
        -- (an appender found it held by a relay; see append.sql).
        SELECT ll.run_id INTO v_run_id
        FROM ledger_wakeups AS w
        INNER JOIN ledger_lanes AS ll ON w.run_id = ll.run_id AND w.lane = ll.lane
        WHERE w.lane = p_lane AND w.run_id <> ALL(v_visited)
        ORDER BY w.created_at
        LIMIT 1
        FOR UPDATE OF ll SKIP LOCKED;
        IF v_run_id IS NULL THEN
            SELECT ll.run_id INTO v_run_id
            FROM ledger_lanes AS ll
            WHERE
                ll.lane = p_lane
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
            p_relay, v_run_id, p_lane, p_max_events, p_batch, p_lease, p_call_id, p_expected_head
        ) AS c;
        IF FOUND THEN
            v_claimed := v_claimed + 1;
            EXIT WHEN v_claimed >= p_runs;
        END IF;
        v_run_id := NULL;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION _claim_ledger_lanes(text, text, text, integer, integer, interval, boolean, bigint, boolean, uuid) IS
'The claim of claim_ledger and claim_ledger_runs after validation: one run''s lane, or up to p_runs discovered lanes.';
