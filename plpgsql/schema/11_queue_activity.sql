-- Queue activity (record_queue_activity, queue_overview; plpgsql/admin/):
-- how many runs of each queue ended completed and failed in each minute, a
-- rollup of the lifecycle ledger's terminal events (run.completed,
-- run.failed) so that the overview's last hour costs one row per queue and
-- minute, never a count of the hour's events.
--
-- A row exists only for a (minute, queue) with activity; a minute with none
-- is a gap. minute is the start of a whole minute in absolute time
-- (date_bin, whatever the session's TimeZone). Written only by
-- record_queue_activity, once per (minute, queue): a minute is finalized
-- when it is at least the grace period (2 minutes) in the past, never
-- rewritten after. Rows older than a day are deleted by the same call.
-- Small: at most 1440 minutes a day per queue with activity.
CREATE TABLE queue_activity (
    minute timestamptz NOT NULL,
    queue text NOT NULL,
    completed integer NOT NULL,
    failed integer NOT NULL,
    PRIMARY KEY (minute, queue),
    CONSTRAINT queue_activity_whole_minute CHECK (
        minute = date_bin('1 minute', minute, timestamptz '2000-01-01 00:00:00+00')
    ),
    CONSTRAINT queue_activity_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT queue_activity_counts CHECK (completed >= 0 AND failed >= 0)
);

-- Where the rollup stands: every minute before final_before is final in
-- queue_activity (its terminal events counted; a minute of that range with
-- no row had none). No row: the rollup never ran. One row at most
-- (singleton), moved forward by record_queue_activity in the transaction
-- that inserts the minutes it finalized, so a reader's snapshot sees both
-- or neither. updated_at: when it last moved (a stale value says no
-- maintenance loop has run lately; queue_overview is exact regardless).
CREATE TABLE queue_activity_watermark (
    singleton boolean PRIMARY KEY DEFAULT TRUE,
    final_before timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT queue_activity_watermark_singleton CHECK (singleton),
    CONSTRAINT queue_activity_watermark_whole_minute CHECK (
        final_before = date_bin('1 minute', final_before, timestamptz '2000-01-01 00:00:00+00')
    )
);
