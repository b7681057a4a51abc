-- ledger_stats: ledger events by lane and state, the age of the oldest
-- undelivered event, and blocked heads (lanes stopped behind a failed event).
-- It counts, so it costs O(events). The clock is the _clock view
-- (_internal/now.sql), the one every function reads.
CREATE VIEW ledger_stats AS
SELECT
    l.lane,
    l.state,
    count(*) AS events,
    extract(EPOCH FROM c.now - min(l.created_at) FILTER (
        WHERE l.state <> 'delivered'
    )) AS oldest_pending_age_seconds,
    (
        SELECT count(*) FROM ledger_lanes AS ll
        WHERE ll.lane = l.lane AND ll.blocked
    ) AS blocked_heads
FROM ledger AS l
CROSS JOIN _clock AS c
GROUP BY l.lane, l.state, c.now;

COMMENT ON VIEW ledger_stats IS
'Ledger events by lane and state: counts, oldest pending age and blocked heads.';
