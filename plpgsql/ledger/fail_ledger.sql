-- fail_ledger(): a delivery failed.
--
-- For each of event_ids leased by `relay`: delivery_attempts + 1 and
-- last_error = error, then
--   retrying — pending again at retry_at, or after exponential backoff with
--              jitter (settings.retry_base_seconds, capped);
--   blocked  — permanent, or settings.ledger_max_delivery_attempts reached:
--              the event is failed and its lane stays blocked behind it until
--              an operator calls requeue_ledger_event.
-- Events not leased by `relay` are not touched and not returned. A frozen
-- batch keeps its membership. A lease covers an unbroken run of its lane
-- from the head, so the leased events behind a failed one are handed back
-- with it, uncharged (_cut_leases). Locks the lane rows in (run_id, lane) order.
-- A retry due at once (retry_at in the past) notifies runrelay_ledger.
CREATE TYPE fail_ledger_result AS (
    event_id bigint,
    outcome text
);

CREATE FUNCTION fail_ledger(
    relay text,
    event_ids bigint[],
    error jsonb,
    retry_at timestamptz DEFAULT NULL,
    permanent boolean DEFAULT FALSE
)
RETURNS SETOF fail_ledger_result
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
    v_max integer;
    v_ids bigint[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('relay', fail_ledger.relay);
    PERFORM _check_event_ids(fail_ledger.event_ids);
    PERFORM _check_json('error', fail_ledger.error);
    PERFORM _check_time('retry_at', fail_ledger.retry_at);
    IF fail_ledger.permanent IS NULL THEN
        PERFORM _invalid('permanent', 'must not be null', 'Pass true or false.');
    END IF;
    PERFORM _lock_event_lanes(fail_ledger.event_ids);
    v_now := _now();
    SELECT s.ledger_max_delivery_attempts INTO v_max FROM settings AS s;
    -- The leases end at the first failed event (_cut_leases); the failure
    -- itself changes no indexed column, so each event's update is HOT.
    v_ids := _cut_leases(fail_ledger.relay, fail_ledger.event_ids);
    RETURN QUERY
    UPDATE ledger_events AS l
    SET delivery_attempts = l.delivery_attempts + 1,
        last_error = fail_ledger.error,
        failed_at = CASE
            WHEN fail_ledger.permanent OR l.delivery_attempts + 1 >= v_max THEN v_now
        END,
        next_attempt_at = CASE
            WHEN fail_ledger.permanent OR l.delivery_attempts + 1 >= v_max THEN l.next_attempt_at
            ELSE coalesce(fail_ledger.retry_at, v_now + _backoff(l.delivery_attempts + 1))
        END
    WHERE l.event_id = ANY(v_ids)
    RETURNING l.event_id, CASE WHEN l.failed_at IS NOT NULL THEN 'blocked' ELSE 'retrying' END;
    PERFORM _refresh_event_lanes(fail_ledger.event_ids);
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION fail_ledger(text, bigint[], jsonb, timestamptz, boolean) IS
'Records a failed delivery: retrying (with backoff) or blocked (permanent, or attempts exhausted).';
