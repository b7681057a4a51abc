-- _ledger_row(): one ledger event as the claim and acknowledgement functions
-- report it (_claim_lane, ack_ledger, claim_ledger's replay): kind, the
-- event, its lease with lease_remaining_ms measured at p_now (pass the clock
-- at the moment of answering, read into a variable just before), and for an
-- acknowledged event lag_ms = delivered_at - created_at. The lease lives on
-- the lane (schema/06_ledger.sql), so the caller passes it:
-- p_lease_expires_at for a leased event (NULL otherwise), and p_batch_id,
-- the lane's frozen batch the event belongs to (an acknowledged event
-- carries the batch it was delivered in itself, or the caller passes it
-- from its delivery), and p_delivered_at, the delivery of an event whose
-- own columns do not carry it (read from the `ledger` view). The row type is
-- ack_ledger_result; claim_ledger returns its first eleven columns
-- (00_types.sql).
-- Called as CROSS JOIN LATERAL _ledger_row(...) for every row a claim or an
-- acknowledgement answers (100 per batch of 100), so it is written to be
-- inlined: a set-returning SQL function with a SQL-standard body, IMMUTABLE
-- (it reads only its arguments) and without a SET clause, which the planner
-- expands into the calling statement as if the columns were spelled out
-- there. A PL/pgSQL call per row was about a fifth of a relay's server
-- time. The planner inlines it only when no argument is volatile: hence
-- p_now from a variable, never _clock_now() in the call.
CREATE FUNCTION _ledger_row(
    p_kind text,
    p_event ledger_events,
    p_batch_id uuid,
    p_lease_expires_at timestamptz,
    p_now timestamptz,
    p_delivered_at timestamptz DEFAULT NULL
)
RETURNS SETOF ack_ledger_result
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT
        p_kind,
        (p_event).event_id AS event_id,
        (p_event).run_id AS run_id,
        (p_event).seq AS seq,
        (p_event).type AS type,
        (p_event).payload AS payload,
        (p_event).delivery_key AS delivery_key,
        (p_event).created_at AS created_at,
        coalesce((p_event).batch_id, p_batch_id) IS NOT NULL AS frozen,
        p_lease_expires_at,
        CASE
            WHEN p_lease_expires_at IS NOT NULL
                THEN floor(extract(EPOCH FROM p_lease_expires_at - p_now) * 1000)::bigint
        END AS lease_remaining_ms,
        floor(
            extract(EPOCH FROM coalesce((p_event).delivered_at, p_delivered_at) - (p_event).created_at) * 1000
        )::bigint AS lag_ms;
END;

COMMENT ON FUNCTION _ledger_row(text, ledger_events, uuid, timestamptz, timestamptz, timestamptz) IS
'Formats one ledger event as a claim/ack row (inlined); lease_remaining_ms measured at p_now, lag_ms for acknowledged events.';
