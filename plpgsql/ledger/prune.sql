-- prune(): delete delivered ledger events older than a cut-off, at most
-- max_rows per call (oldest events first), so a scheduled job can keep the
-- table small without long transactions. Rows a relay still leases or has
-- not delivered are never touched. Returns the number of events deleted.
-- An event is delivered after it is created, so the events delivered before
-- the cut-off are among those created before it: prune walks
-- ledger_created_idx up to the cut-off, taking each event's delivery from
-- the `ledger` view (a primary-key seek) and skipping the events in that
-- range that are undelivered or were delivered later (in a ledger pruned
-- regularly, the old undelivered ones: a blocked lane's, a backlog's). Then the
-- acknowledgements made before the cut-off whose events are all gone go too
-- (ledger_deliveries_delivered_idx; at most max_rows of them): an
-- acknowledgement's events were all created before it, so once prune has
-- caught up none of them is left.
CREATE FUNCTION prune(delivered_before timestamptz, max_rows integer DEFAULT 10000)
RETURNS integer
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
    v_count integer;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_time('delivered_before', prune.delivered_before, FALSE);
    PERFORM _check_int('max_rows', prune.max_rows, 1, 1000000);
    DELETE FROM ledger_events AS l
    WHERE l.event_id IN (
        SELECT d.event_id
        FROM ledger AS d
        WHERE d.created_at < prune.delivered_before AND d.delivered_at < prune.delivered_before
        ORDER BY d.created_at, d.event_id
        LIMIT prune.max_rows
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM ledger_deliveries AS l
    WHERE l.ctid = ANY(ARRAY(
        SELECT d.ctid
        FROM ledger_deliveries AS d
        WHERE
            d.delivered_at < prune.delivered_before
            AND NOT EXISTS (
                SELECT FROM ledger_events AS e
                WHERE e.run_id = d.run_id AND e.lane = d.lane AND e.seq >= d.first_seq AND e.seq <= d.last_seq
            )
        ORDER BY d.delivered_at
        LIMIT prune.max_rows
    ));
    RETURN _restore_lock_wait(v_caller_lock_timeout, v_count);
END;
$$;

COMMENT ON FUNCTION prune(timestamptz, integer) IS
'Deletes up to max_rows ledger events delivered before the cut-off, then acknowledgements left without events; returns the events deleted.';
