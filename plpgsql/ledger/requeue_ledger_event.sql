-- requeue_ledger_event(): an operator unblocks a failed event.
--
-- The event becomes pending and due now, with delivery_attempts reset (its
-- last_error is kept for the record); its lane is unblocked. Returns true if
-- the event was failed, false otherwise (the event is unchanged). Locks the
-- lane row.
CREATE FUNCTION requeue_ledger_event(event_id bigint)
RETURNS boolean
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
    v_requeued bigint[];
BEGIN
    PERFORM _require_read_committed();
    IF requeue_ledger_event.event_id IS NULL THEN
        PERFORM _invalid('event_id', 'must not be null', 'Pass the event_id of a failed event.');
    END IF;
    PERFORM _lock_event_lanes(ARRAY[requeue_ledger_event.event_id]);
    v_requeued := _requeue_failed(ARRAY[requeue_ledger_event.event_id]);
    -- Refreshed even when nothing was requeued: whoever holds a lane lock
    -- refreshes it (an appender may have left the lane to us).
    PERFORM _refresh_event_lanes(ARRAY[requeue_ledger_event.event_id]);
    RETURN _restore_lock_wait(v_caller_lock_timeout, cardinality(v_requeued) > 0);
END;
$$;

COMMENT ON FUNCTION requeue_ledger_event(bigint) IS
'Unblocks a failed ledger event: pending again and due now; true if it was failed.';
