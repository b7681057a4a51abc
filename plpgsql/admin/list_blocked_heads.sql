-- list_blocked_heads(): the run lanes blocked behind a failed head (SPEC
-- §3.3: a failed event blocks its lane until an operator requeues it), each
-- with its head event: type, creation, when it failed, its delivery
-- attempts and the last error a relay reported. In (run_id, lane) order (the
-- database's collation), a page at a time: lanes after (after_run_id,
-- after_lane), the last row of the previous page, at most max_rows; run_id
-- and lane keep one run's or one lane's.
--
-- Reads only: ledger_lanes_blocked_idx (blocked lanes only) and one probe
-- of each head event; no lock, no write. A lane requeued or blocked while
-- pages are read appears as it is when its page is read.
CREATE TYPE blocked_head AS (
    run_id text,
    lane text,
    event_id bigint,
    seq bigint,
    type text,
    created_at timestamptz,
    failed_at timestamptz,
    delivery_attempts integer,
    last_error jsonb
);

CREATE FUNCTION list_blocked_heads(
    lane text DEFAULT NULL,
    run_id text DEFAULT NULL,
    after_run_id text DEFAULT NULL,
    after_lane text DEFAULT NULL,
    max_rows integer DEFAULT 100
)
RETURNS SETOF blocked_head
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    IF list_blocked_heads.lane IS NOT NULL THEN
        PERFORM _check_lane(list_blocked_heads.lane);
    END IF;
    PERFORM _check_id('run_id', list_blocked_heads.run_id, TRUE);
    PERFORM _check_id('after_run_id', list_blocked_heads.after_run_id, TRUE);
    IF list_blocked_heads.after_lane NOT IN ('lifecycle', 'observability') THEN
        PERFORM _invalid('after_lane', format('unknown lane %s', _quote(list_blocked_heads.after_lane)),
            'Pass lifecycle or observability.');
    END IF;
    IF (list_blocked_heads.after_run_id IS NULL) <> (list_blocked_heads.after_lane IS NULL) THEN
        PERFORM _invalid(
            CASE WHEN list_blocked_heads.after_run_id IS NULL THEN 'after_run_id' ELSE 'after_lane' END,
            CASE
                WHEN list_blocked_heads.after_run_id IS NULL THEN 'must be given together with after_lane'
                ELSE 'must be given together with after_run_id'
            END,
            'Pass both after_run_id and after_lane (the last row of the previous page), or neither.');
    END IF;
    PERFORM _check_int('max_rows', list_blocked_heads.max_rows, 1, 1000);
    -- The page's lanes first, then one probe of each head: the page costs
    -- max_rows probes whatever the number of blocked lanes.
    RETURN QUERY
    SELECT b.run_id, b.lane, e.event_id, e.seq, e.type, e.created_at, e.failed_at, e.delivery_attempts, e.last_error
    FROM (
        SELECT ll.run_id, ll.lane, ll.head_seq
        FROM ledger_lanes AS ll
        WHERE
            ll.blocked
            AND (list_blocked_heads.run_id IS NULL OR ll.run_id = list_blocked_heads.run_id)
            AND (list_blocked_heads.lane IS NULL OR ll.lane = list_blocked_heads.lane)
            -- ('', '') sorts before every lane: the first page.
            AND (ll.run_id, ll.lane) > (
                coalesce(list_blocked_heads.after_run_id, ''), coalesce(list_blocked_heads.after_lane, '')
            )
        ORDER BY ll.run_id, ll.lane
        LIMIT list_blocked_heads.max_rows
    ) AS b
    CROSS JOIN LATERAL (
        SELECT h.event_id, h.seq, h.type, h.created_at, h.failed_at, h.delivery_attempts, h.last_error
        FROM ledger_events AS h
        WHERE h.run_id = b.run_id AND h.lane = b.lane AND h.seq = b.head_seq
        LIMIT 1
    ) AS e
    ORDER BY b.run_id, b.lane;
END;
$$;

COMMENT ON FUNCTION list_blocked_heads(text, text, text, text, integer) IS
'Lists the lanes blocked behind a failed head, with the head''s last error, in (run_id, lane) order, a page at a time.';
