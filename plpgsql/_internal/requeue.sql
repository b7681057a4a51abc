-- _requeue_failed(): the one requeue of failed ledger events, behind
-- requeue_ledger_event and requeue_blocked_heads. Of p_event_ids, each
-- failed event (blocked until requeued, failed_at set) becomes pending and
-- due now with delivery_attempts reset; its last_error is kept for the
-- record. Events that are not failed are left as they are. The caller holds
-- the events' lane locks (_lock_event_lanes) and refreshes the lanes after
-- (_refresh_event_lanes). Returns the events it requeued. No indexed column
-- changes, so each update is HOT (schema/06_ledger.sql).
CREATE FUNCTION _requeue_failed(p_event_ids bigint[])
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_requeued bigint[];
BEGIN
    WITH requeued AS (
        UPDATE ledger_events AS l
        SET failed_at = NULL, delivery_attempts = 0, next_attempt_at = _now()
        -- failed_at marks a failed event.
        WHERE l.event_id = ANY(p_event_ids) AND l.failed_at IS NOT NULL
        RETURNING l.event_id
    )
    SELECT coalesce(array_agg(r.event_id ORDER BY r.event_id), '{}'::bigint[]) INTO v_requeued
    FROM requeued AS r;
    RETURN v_requeued;
END;
$$;

COMMENT ON FUNCTION _requeue_failed(bigint[]) IS
'Requeues the failed events among p_event_ids (pending, due now, attempts reset; caller holds their lanes); returns them.';
