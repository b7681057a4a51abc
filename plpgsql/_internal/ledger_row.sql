-- _ledger_row(): one ledger event as the claim and acknowledgement functions
-- report it (_claim_lane, ack_ledger, claim_ledger's replay): kind, the
-- event, its lease with lease_remaining_ms measured at p_now (pass the clock
-- at the moment of answering, _clock_now()), and for an acknowledged event
-- lag_ms = delivered_at - created_at. The lease lives on the lane
-- (schema/06_ledger.sql), so the caller passes it: p_lease_expires_at for a
-- leased event (NULL otherwise), and p_batch_id, the lane's frozen batch the
-- event belongs to (an acknowledged event carries the batch it was
-- delivered in itself). The row type is ack_ledger_result;
-- claim_ledger returns its first eleven columns (00_types.sql).
-- PL/pgSQL, not SQL, for the reason given at _key_lock_id (custody.sql): a
-- SQL function with a SET clause is never inlined and is planned again on
-- every call of the statement that calls it.
CREATE FUNCTION _ledger_row(
    p_kind text,
    p_event ledger_events,
    p_batch_id uuid,
    p_lease_expires_at timestamptz,
    p_now timestamptz
)
RETURNS ack_ledger_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN ROW(
        p_kind, p_event.event_id, p_event.run_id, p_event.seq, p_event.type, p_event.payload,
        p_event.delivery_key, p_event.created_at, coalesce(p_event.batch_id, p_batch_id) IS NOT NULL,
        p_lease_expires_at,
        CASE
            WHEN p_lease_expires_at IS NOT NULL
                THEN floor(extract(EPOCH FROM p_lease_expires_at - p_now) * 1000)::bigint
        END,
        CASE
            WHEN p_event.delivered_at IS NOT NULL
                THEN floor(extract(EPOCH FROM p_event.delivered_at - p_event.created_at) * 1000)::bigint
        END
    )::ack_ledger_result;
END;
$$;

COMMENT ON FUNCTION _ledger_row(text, ledger_events, uuid, timestamptz, timestamptz) IS
'Formats one ledger event as a claim/ack row; lease_remaining_ms measured at p_now, lag_ms for acknowledged events.';
