-- requeue_blocked_heads(): an operator unblocks blocked lanes: one run's
-- lane (run_id and lane), one run's lanes (run_id), or every blocked lane
-- of a lane kind or of both, at most max_lanes of them per call, in
-- (run_id, lane) order. In each, every failed event from the head on is
-- requeued as requeue_ledger_event requeues one (_requeue_failed: pending,
-- due now, delivery_attempts reset, last_error kept), so the lane is
-- claimable again at once; relays are notified.
--
-- Returns one row per lane it requeued events in: (run_id, lane, requeued,
-- the number of events). No row: nothing matched was blocked. Call again
-- until no row comes back to unblock more than max_lanes lanes; a lane that
-- a relay fails again meanwhile is blocked again and found by the next call.
--
-- Locks: the lane rows, waiting, in the lane order (_lock_event_lanes:
-- run_id COLLATE "C", lane) under the bounded lock wait (10 s, or the
-- caller's tighter lock_timeout; 55P03, nothing written); no run row. The
-- blocked lanes and their failed events are found without locks, then
-- re-checked under them: an event requeued or delivered meanwhile is left
-- as it is. Cost: ledger_lanes_blocked_idx, then each lane's pending
-- events from its head (ledger_lane_seq_idx). With enable_seqscan off, as
-- the ledger functions run: statistics taken while ledger_events was small
-- made the per-lane look-ups sequential scans of the whole table.
CREATE TYPE requeued_lane AS (
    run_id text,
    lane text,
    requeued integer
);

CREATE FUNCTION requeue_blocked_heads(
    run_id text DEFAULT NULL,
    lane text DEFAULT NULL,
    max_lanes integer DEFAULT 100
)
RETURNS SETOF requeued_lane
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_failed bigint[];
    v_requeued bigint[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', requeue_blocked_heads.run_id, TRUE);
    IF requeue_blocked_heads.lane IS NOT NULL THEN
        PERFORM _check_lane(requeue_blocked_heads.lane);
    END IF;
    PERFORM _check_int('max_lanes', requeue_blocked_heads.max_lanes, 1, 1000);

    SELECT coalesce(array_agg(f.event_id), '{}'::bigint[]) INTO v_failed
    FROM (
        SELECT ll.run_id, ll.lane, ll.head_seq
        FROM ledger_lanes AS ll
        WHERE
            ll.blocked
            AND (requeue_blocked_heads.run_id IS NULL OR ll.run_id = requeue_blocked_heads.run_id)
            AND (requeue_blocked_heads.lane IS NULL OR ll.lane = requeue_blocked_heads.lane)
        ORDER BY ll.run_id, ll.lane
        LIMIT requeue_blocked_heads.max_lanes
    ) AS b
    -- A range of ledger_lane_seq_idx per lane, from its head. LIMIT keeps
    -- it one (the planner does not flatten the subquery into a join that
    -- may read the whole table). Failed events come from failed claims (at
    -- most 1000 events each), so 10000 per lane leaves ample room; a lane
    -- with more is blocked again and the next call requeues the rest.
    CROSS JOIN LATERAL (
        SELECT e.event_id
        FROM ledger_events AS e
        WHERE
            e.run_id = b.run_id AND e.lane = b.lane AND e.seq >= b.head_seq
            AND e.delivered_at IS NULL AND e.failed_at IS NOT NULL
        ORDER BY e.seq
        LIMIT 10000
    ) AS f;
    IF cardinality(v_failed) = 0 THEN
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;

    PERFORM _lock_event_lanes(v_failed);
    v_requeued := _requeue_failed(v_failed);
    PERFORM _refresh_event_lanes(v_failed);
    RETURN QUERY
    SELECT e.run_id, e.lane, count(*)::integer
    FROM ledger_events AS e
    WHERE e.event_id = ANY(v_requeued)
    GROUP BY e.run_id, e.lane
    ORDER BY e.run_id, e.lane;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION requeue_blocked_heads(text, text, integer) IS
'Unblocks up to max_lanes blocked lanes (one run''s lane, a run''s, or all of a lane kind): their failed events requeued.';
