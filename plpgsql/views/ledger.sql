-- ledger: every ledger event as SPEC §2 describes it, one row per event of
-- ledger_events with its state and lease read from its lane, and its
-- delivery from the ledger_deliveries row that covers it (a relay's
-- acknowledgement is one row for its whole prefix, schema/06_ledger.sql).
-- The functions read an acknowledged event's delivery here too: this is
-- the one place that knows where a delivery is written.
--
-- The lease of a lane's claimed events lives on the lane row (the lease
-- watermark: ledger_lanes.lease_owner, lease_expires_at and leased_through,
-- the batch in batch_id, batch_started_at and batch_through), so that
-- leasing a batch writes one lane row and no event row. An event reads as
--   skipped    once an operator ended it, failed, without delivery
--              (skip_ledger_events: skipped_at, with skip_reason and
--              skipped_by),
--   delivered  once acknowledged (a delivery covers it),
--   failed     when blocked until requeued (failed_at),
--   leased     while it lies inside its lane's lease (seq <= leased_through:
--              every undelivered event lies at or after the head), with that
--              lease's owner, expiry and call,
--   pending    otherwise;
-- with the batch it was delivered in, or while undelivered the lane's frozen
-- batch it belongs to (seq <= batch_through). A lapsed lease nobody took over
-- still reads as leased, as the lease does for the functions.
-- Reading it costs what reading ledger_events costs, plus one primary-key
-- probe of the lane per event (or one join) and one of ledger_deliveries.
CREATE VIEW ledger AS
SELECT
    e.event_id,
    e.run_id,
    e.lane,
    e.seq,
    e.type,
    e.payload,
    e.delivery_key,
    e.transport_only,
    e.created_at,
    CASE
        WHEN e.skipped_at IS NOT NULL THEN 'skipped'
        WHEN d.delivered_at IS NOT NULL THEN 'delivered'
        WHEN e.failed_at IS NOT NULL THEN 'failed'
        WHEN e.seq <= ll.leased_through THEN 'leased'
        ELSE 'pending'
    END AS state,
    CASE
        WHEN d.delivered_at IS NULL AND e.failed_at IS NULL AND e.seq <= ll.leased_through
            THEN ll.lease_owner
    END AS lease_owner,
    CASE
        WHEN d.delivered_at IS NULL AND e.failed_at IS NULL AND e.seq <= ll.leased_through
            THEN ll.lease_expires_at
    END AS lease_expires_at,
    CASE
        WHEN d.delivered_at IS NOT NULL THEN d.batch_id
        WHEN e.seq <= ll.batch_through THEN ll.batch_id
    END AS batch_id,
    CASE
        WHEN d.delivered_at IS NOT NULL THEN d.batch_started_at
        WHEN e.seq <= ll.batch_through THEN ll.batch_started_at
    END AS batch_started_at,
    e.delivery_attempts,
    e.next_attempt_at,
    e.failed_at,
    e.last_error,
    d.delivered_at,
    d.delivered_by,
    CASE
        WHEN d.delivered_at IS NULL AND e.failed_at IS NULL AND e.seq <= ll.leased_through
            THEN ll.lease_call_id
        ELSE d.call_id
    END AS call_id,
    e.acked_locally,
    e.skip_reason,
    e.skipped_by
FROM ledger_events AS e
LEFT JOIN ledger_lanes AS ll ON e.run_id = ll.run_id AND e.lane = ll.lane
-- The event's delivery: its own columns when it was delivered on its own
-- (acknowledged locally, skipped, or delivered before relay deliveries were
-- recorded by range), otherwise, for an event below its lane's head (the
-- delivered ones), the first delivery row of its lane ending at or after
-- its seq, if that row starts at or before it (ranges of a lane never
-- overlap): one seek of the primary key, and none for an undelivered event.
LEFT JOIN LATERAL (
    SELECT
        e.delivered_at,
        e.delivered_by,
        e.call_id,
        e.batch_id,
        e.batch_started_at
    WHERE e.delivered_at IS NOT NULL
    UNION ALL
    SELECT
        x.delivered_at,
        x.delivered_by,
        x.call_id,
        CASE WHEN e.seq <= x.batch_through THEN x.batch_id END AS batch_id,
        CASE WHEN e.seq <= x.batch_through THEN x.batch_started_at END AS batch_started_at
    FROM (
        SELECT y.*
        FROM ledger_deliveries AS y
        WHERE
            y.run_id = e.run_id AND y.lane = e.lane AND y.last_seq >= e.seq
            AND e.delivered_at IS NULL AND e.seq < coalesce(ll.head_seq, ll.delivered_below)
        ORDER BY y.last_seq
        LIMIT 1
    ) AS x
    WHERE x.first_seq <= e.seq
) AS d ON TRUE;

COMMENT ON VIEW ledger IS
'Every ledger event with its state and lease (read from its lane) and its delivery: the ledger of SPEC section 2.';
