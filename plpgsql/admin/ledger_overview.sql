-- ledger_overview(): one row per lane kind, lifecycle then observability
-- (both always, zeros when idle): how much of the ledger waits for its
-- consumer and for how long.
--
--   pending_lanes               run lanes with an undelivered event: a head
--                               (pending, leased, retrying or blocked), or
--                               a wake-up an appender left for a lane a
--                               relay held (schema/06_ledger.sql)
--   leased_lanes                those a relay holds a lease on that has not
--                               expired (a lapsed lease is claimable again:
--                               pending, not leased)
--   blocked_heads               those stopped behind a failed head until an
--                               operator requeues it (list_blocked_heads)
--   oldest_pending_age_seconds  now - created_at of the oldest undelivered
--                               head: the delivery lag (null when none)
--
-- Cost: O(pending lanes), never the events or the delivered history. A
-- lane with a head is either available (ledger_lanes_available_idx, whose
-- entries are exactly the lanes with a head that is not blocked: pending,
-- retrying or leased, whose available_at is the lease's expiry) or blocked
-- (ledger_lanes_blocked_idx); each such lane row is read, and its head
-- event probed by ledger_lane_seq_idx for its created_at. Wake-ups are a
-- range of ledger_wakeups_lane_idx (rare, short-lived rows), each probed
-- in ledger_lanes. No index is added for this: the lanes' indexes already
-- partition the pending lanes, so a delivery writes nothing more.
--
-- A lane a relay drained while a writer held its run row stays available
-- for a re-check 200 ms later (_refresh_lane) and counts as pending until
-- then. Reads only: no lock, no write; one statement, one snapshot.
CREATE TYPE ledger_overview_row AS (
    lane text,
    pending_lanes bigint,
    leased_lanes bigint,
    blocked_heads bigint,
    oldest_pending_age_seconds double precision
);

CREATE FUNCTION ledger_overview()
RETURNS SETOF ledger_overview_row
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- As queue_overview: a generic plan's guess at the pending lanes must not
-- make it compile the statement, nor read every lane instead of the
-- pending lanes' index ranges.
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := _now();
BEGIN
    PERFORM _require_read_committed();
    RETURN QUERY
    SELECT
        k.lane,
        h.pending + w.pending,
        h.leased,
        h.blocked,
        extract(EPOCH FROM v_now - least(h.oldest, w.oldest))::double precision
    FROM (VALUES (1, 'lifecycle'), (2, 'observability')) AS k (ord, lane)
    CROSS JOIN LATERAL (
        SELECT
            count(*) AS pending,
            count(*) FILTER (WHERE x.lease_expires_at > v_now) AS leased,
            count(*) FILTER (WHERE x.blocked) AS blocked,
            min(e.created_at) AS oldest
        FROM (
            SELECT ll.run_id, ll.head_seq, ll.lease_expires_at, ll.blocked
            FROM ledger_lanes AS ll
            WHERE ll.lane = k.lane AND ll.available_at IS NOT NULL
            UNION ALL
            -- Blocked lanes have no available_at (ledger_lanes_blocked_not_available).
            SELECT ll.run_id, ll.head_seq, ll.lease_expires_at, ll.blocked
            FROM ledger_lanes AS ll
            WHERE ll.blocked AND ll.lane = k.lane
        ) AS x
        -- The head, one probe (LIMIT keeps it one): undelivered, or a lane
        -- due for a re-check whose recorded head was delivered meanwhile.
        LEFT JOIN LATERAL (
            SELECT l.created_at
            FROM ledger_events AS l
            WHERE
                l.run_id = x.run_id AND l.lane = k.lane AND l.seq = x.head_seq
                AND l.delivered_at IS NULL
            LIMIT 1
        ) AS e ON TRUE
    ) AS h
    CROSS JOIN LATERAL (
        -- A wake-up's lane is pending; counted here when it has no head
        -- (one with a head is counted above). created_at: its first event's.
        SELECT
            count(*) FILTER (
                WHERE NOT EXISTS (
                    SELECT FROM ledger_lanes AS ll
                    WHERE ll.run_id = wk.run_id AND ll.lane = wk.lane AND ll.head_seq IS NOT NULL
                )
            ) AS pending,
            min(wk.created_at) AS oldest
        FROM ledger_wakeups AS wk
        WHERE wk.lane = k.lane
    ) AS w
    ORDER BY k.ord;
END;
$$;

COMMENT ON FUNCTION ledger_overview() IS
'Per lane: run lanes with undelivered events, leased and blocked ones, and the age of the oldest undelivered head.';
