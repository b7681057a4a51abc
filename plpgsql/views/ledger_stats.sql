-- ledger_stats: ledger events by lane and state, the age of the oldest
-- undelivered event, and blocked heads (lanes stopped behind a failed event).
-- The lag is told apart by its cause:
--   oldest_pending_age_seconds      every undelivered event (delivered and
--                                   skipped events are done);
--   oldest_deliverable_age_seconds  pending or leased events of lanes that
--                                   are not blocked: what relays have yet to
--                                   deliver (growing: too few relays, or a
--                                   slow consumer);
--   oldest_blocked_age_seconds      failed events: heads that wait for an
--                                   operator (requeue or skip), however
--                                   many relays run.
-- Each is computed within its (lane, state) row; a lane's lag is the
-- largest over its rows. It counts, so it costs O(events). The clock is the
-- _clock view (_internal/now.sql), the one every function reads.
CREATE VIEW ledger_stats AS
SELECT
    l.lane,
    l.state,
    count(*) AS events,
    extract(EPOCH FROM c.now - min(l.created_at) FILTER (
        WHERE l.state NOT IN ('delivered', 'skipped')
    )) AS oldest_pending_age_seconds,
    (
        SELECT count(*) FROM ledger_lanes AS ll
        WHERE ll.lane = l.lane AND ll.blocked
    ) AS blocked_heads,
    extract(EPOCH FROM c.now - min(l.created_at) FILTER (
        WHERE l.state IN ('pending', 'leased') AND NOT coalesce(b.blocked, FALSE)
    )) AS oldest_deliverable_age_seconds,
    extract(EPOCH FROM c.now - min(l.created_at) FILTER (
        WHERE l.state = 'failed'
    )) AS oldest_blocked_age_seconds
FROM ledger AS l
LEFT JOIN ledger_lanes AS b ON l.run_id = b.run_id AND l.lane = b.lane
CROSS JOIN _clock AS c
GROUP BY l.lane, l.state, c.now;

COMMENT ON VIEW ledger_stats IS
'Ledger events by lane and state: counts, oldest pending age (all, deliverable, blocked) and blocked heads.';
