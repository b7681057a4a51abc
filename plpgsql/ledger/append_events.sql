-- append_events(): append events to the end of a run's ledger.
--
-- events: [{type, payload?, lane?, delivery_key?, transport_only?}, ...], at
-- most 1000; lane defaults to lifecycle, the delivery key to <run_id>:<seq>.
-- Locks the run row (custody step 2), so concurrent appends to one run get
-- distinct, increasing seq in commit order; called in a producer's
-- transaction, the events commit (and become claimable) with its writes.
-- Appending to an ended run is allowed (compensations, late facts). An
-- unknown run raises 22023. Not idempotent by itself: pass explicit delivery
-- keys to make a repeated append fail instead of duplicating.
CREATE FUNCTION append_events(run_id text, events jsonb)
RETURNS SETOF append_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '10s'
AS $$
DECLARE
    v_events jsonb;
    v_found text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', append_events.run_id);
    v_events := _normalize_events('events', append_events.events);
    SELECT r.run_id INTO v_found FROM runs AS r WHERE r.run_id = append_events.run_id FOR NO KEY UPDATE;
    IF v_found IS NULL THEN
        PERFORM _invalid('run_id', format('no run %L', append_events.run_id),
            'Enqueue the run first (enqueue_run), in the same transaction if need be.');
    END IF;
    RETURN QUERY SELECT a.event_id, a.seq, a.delivery_key FROM _append(append_events.run_id, v_events) AS a;
END;
$$;

COMMENT ON FUNCTION append_events(text, jsonb) IS
'Appends events to the end of a run''s ledger (per-run seq in commit order); returns event_id, seq, delivery_key.';
