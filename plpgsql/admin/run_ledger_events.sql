-- run_ledger_events(): a run's ledger events in seq order (one order for
-- both lanes: seq is per run), each with its delivery state as the ledger
-- view reads it (views/ledger.sql): pending, leased (owner and expiry),
-- delivered (when and by whom), or failed (blocked until requeued), with
-- its attempts and last error. A page at a time: events after after_seq, at
-- most max_rows; lane restricts them to one lane.
--
-- No row when the run does not exist or has no event. Reads only: one
-- range of ledger_lane_seq_idx per lane, merged, and one primary-key probe
-- of the lane row per event; no lock, no write. Delivered events stay until
-- prune() deletes them.
CREATE TYPE run_ledger_event AS (
    event_id bigint,
    lane text,
    seq bigint,
    type text,
    payload jsonb,
    delivery_key text,
    transport_only boolean,
    created_at timestamptz,
    state text,
    lease_owner text,
    lease_expires_at timestamptz,
    delivery_attempts integer,
    next_attempt_at timestamptz,
    failed_at timestamptz,
    last_error jsonb,
    delivered_at timestamptz,
    delivered_by text
);

CREATE FUNCTION run_ledger_events(
    run_id text,
    lane text DEFAULT NULL,
    after_seq bigint DEFAULT 0,
    max_rows integer DEFAULT 100
)
RETURNS SETOF run_ledger_event
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_lanes text[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', run_ledger_events.run_id);
    IF run_ledger_events.lane IS NOT NULL THEN
        PERFORM _check_lane(run_ledger_events.lane);
    END IF;
    IF run_ledger_events.after_seq IS NULL OR run_ledger_events.after_seq < 0 THEN
        PERFORM _invalid('after_seq',
            format('must be 0 or more (got %s)', coalesce(run_ledger_events.after_seq::text, 'null')),
            'Pass 0 for the first page, then the seq of the last event of the previous page.');
    END IF;
    PERFORM _check_int('max_rows', run_ledger_events.max_rows, 1, 1000);
    v_lanes := CASE
        WHEN run_ledger_events.lane IS NULL THEN ARRAY['lifecycle', 'observability']
        ELSE ARRAY[run_ledger_events.lane]
    END;
    RETURN QUERY
    SELECT
        e.event_id, e.lane, e.seq, e.type, e.payload, e.delivery_key, e.transport_only, e.created_at,
        e.state, e.lease_owner, e.lease_expires_at, e.delivery_attempts, e.next_attempt_at,
        e.failed_at, e.last_error, e.delivered_at, e.delivered_by
    FROM generate_subscripts(v_lanes, 1) AS g (i)
    CROSS JOIN LATERAL (
        SELECT l.*
        FROM ledger AS l
        WHERE
            l.run_id = run_ledger_events.run_id
            AND l.lane = v_lanes[g.i]
            AND l.seq > run_ledger_events.after_seq
        ORDER BY l.seq
        LIMIT run_ledger_events.max_rows
    ) AS e
    ORDER BY e.seq
    LIMIT run_ledger_events.max_rows;
END;
$$;

COMMENT ON FUNCTION run_ledger_events(text, text, bigint, integer) IS
'A run''s ledger events in seq order with their delivery state (pending, leased, delivered, failed), a page at a time.';
