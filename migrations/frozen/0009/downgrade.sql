-- Undo revision 0009's table changes. Each change has its own section,
-- delimited by a header and an end line, so that sections written
-- separately merge side by side.

-- ==== delivery records =====================================================
-- The deliveries go back onto their events, where revision 0008 reads them,
-- and the truncation trigger no longer knows the table (the "purging runs"
-- section puts back 0008's _runs_deleted).
UPDATE ledger_events AS e
SET
    delivered_at = d.delivered_at,
    delivered_by = d.delivered_by,
    call_id = d.call_id,
    batch_id = CASE WHEN e.seq <= d.batch_through THEN d.batch_id END,
    batch_started_at = CASE WHEN e.seq <= d.batch_through THEN d.batch_started_at END
FROM ledger_deliveries AS d
WHERE
    e.run_id = d.run_id AND e.lane = d.lane AND e.seq >= d.first_seq AND e.seq <= d.last_seq
    AND e.delivered_at IS NULL;

COMMENT ON FUNCTION _runs_deleted() IS
'Trigger: deletes the ledger events, lanes and wake-ups of deleted runs (the cascade of the ledger tables).';

CREATE OR REPLACE FUNCTION _runs_truncated()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- A table truncated by the same statement is empty, and still open:
    -- truncating it again would fail (55006), so only a non-empty one is.
    IF EXISTS (SELECT FROM ledger_events) THEN
        TRUNCATE ledger_events;
    END IF;
    IF EXISTS (SELECT FROM ledger_lanes) THEN
        TRUNCATE ledger_lanes;
    END IF;
    IF EXISTS (SELECT FROM ledger_wakeups) THEN
        TRUNCATE ledger_wakeups;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _runs_truncated() IS
'Trigger: empties the ledger tables when runs is truncated (the cascade of the ledger tables).';

DROP TABLE ledger_deliveries;

ALTER TABLE ledger_events SET (fillfactor = 50);
-- ==== end: delivery records ================================================

-- ==== explicit delivery keys ===============================================
-- 0008 indexes every delivery key: the default keys join the unique index
-- (they are unique, so the build cannot fail on them).
DROP INDEX ledger_delivery_key_unique;
ALTER TABLE ledger_events ADD CONSTRAINT ledger_delivery_key_unique UNIQUE (delivery_key);
-- ==== end: explicit delivery keys ==========================================

-- ==== notification kinds ===================================================
-- 0008 sends every notification: a kind turned off is on again.
ALTER TABLE settings DROP COLUMN notifications;
-- ==== end: notification kinds ==============================================

-- ==== row rules without a path ============================================
-- The migrations run with the install's schema and pg_temp as the path, as
-- when revision 0008 created these functions.
ALTER FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint, integer
) SET search_path FROM CURRENT;
ALTER FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
) SET search_path FROM CURRENT;
ALTER FUNCTION _ledger_events_rules(
    text, text, text, bigint, timestamptz, text, timestamptz, uuid, timestamptz,
    integer, boolean, uuid
) SET search_path FROM CURRENT;
-- ==== end: row rules without a path =======================================

-- ==== lane rules ===========================================================
ALTER TABLE ledger_lanes
DROP CONSTRAINT ledger_lanes_rules,
ADD CONSTRAINT ledger_lanes_lane CHECK (lane IN ('lifecycle', 'observability')),
ADD CONSTRAINT ledger_lanes_blocked_not_available CHECK (
    NOT blocked OR available_at IS NULL
),
ADD CONSTRAINT ledger_lanes_available_has_head CHECK (
    available_at IS NULL OR head_seq IS NOT NULL
),
ADD CONSTRAINT ledger_lanes_lease CHECK (
    (lease_owner IS NULL) = (lease_expires_at IS NULL)
    AND (lease_owner IS NULL) = (leased_through IS NULL)
    AND (lease_call_id IS NULL OR lease_owner IS NOT NULL)
),
ADD CONSTRAINT ledger_lanes_batch CHECK (
    (batch_id IS NULL) = (batch_started_at IS NULL)
    AND (batch_id IS NULL) = (batch_through IS NULL)
);

DROP FUNCTION _ledger_lanes_rules(
    text, bigint, timestamptz, boolean, text, timestamptz, bigint, uuid, uuid,
    timestamptz, bigint
);
-- ==== end: lane rules ======================================================

-- ==== purge plans ==========================================================
ALTER FUNCTION _runs_deleted() RESET enable_seqscan;
-- ==== end: purge plans =====================================================

-- ==== durable steps ========================================================
-- 0008 has no steps: every recorded step is dropped (a run retried after the
-- downgrade does its steps again).
DROP TABLE steps;
ALTER TABLE settings DROP COLUMN step_events;
-- ==== end: durable steps ===================================================

-- ==== live processes =======================================================
DROP INDEX ledger_lanes_lease_owner_idx;
DROP INDEX attempts_finished_idx;
-- ==== end: live processes ==================================================

-- ==== skipped events =======================================================
DELETE FROM calls AS c
WHERE c.function_name = 'skip_ledger_events';
ALTER TABLE calls
DROP CONSTRAINT calls_reply,
DROP COLUMN reply,
DROP CONSTRAINT calls_outcome,
ADD CONSTRAINT calls_outcome CHECK (
    (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
    OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
    OR (function_name = 'retry_run' AND outcome = 'retried')
);
ALTER TABLE ledger_events
DROP COLUMN skipped_at,
DROP COLUMN skip_reason,
DROP COLUMN skipped_by,
DROP COLUMN skip_call_id;
-- ==== end: skipped events ==================================================

-- ==== tasks ================================================================
DROP INDEX runs_claim_task_idx;
ALTER TABLE runs DROP COLUMN task;
-- ==== end: tasks ===========================================================

-- ==== cancel reason ========================================================
ALTER TABLE runs DROP COLUMN cancel_reason;
-- ==== end: cancel reason ===================================================

-- ==== purge lock order =====================================================
-- Nothing of its own to undo: the "purging runs" section puts back 0008's
-- body of _runs_deleted, which this section's upgrade replaced again.
-- ==== end: purge lock order ================================================

-- ==== shard ownership ======================================================
DROP TABLE shard_ownership;
-- ==== end: shard ownership =================================================

-- ==== lock rows ============================================================
DROP TABLE call_locks;
DROP TABLE concurrency_keys;
-- ==== end: lock rows =======================================================

-- ==== queue activity =======================================================
-- 0008 has no overview: the rollup goes (the ledger it was counted from stays).
DROP TABLE queue_activity_watermark;
DROP TABLE queue_activity;
-- ==== end: queue activity ==================================================

-- ==== trace context ========================================================
-- 0008 traces nothing: the runs' trace contexts are dropped.
ALTER TABLE runs DROP COLUMN trace_context;
-- ==== end: trace context ===================================================

-- ==== schedules ============================================================
-- 0008 has no schedules: every declaration is dropped (the runs they
-- enqueued stay).
DROP TABLE schedules;
-- ==== end: schedules =======================================================

-- ==== purging runs =========================================================
DROP INDEX calls_run_id_idx;

CREATE OR REPLACE FUNCTION _runs_deleted()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM ledger_events AS l WHERE l.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    DELETE FROM ledger_lanes AS ll WHERE ll.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    DELETE FROM ledger_wakeups AS w WHERE w.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    RETURN NULL;
END;
$$;
-- ==== end: purging runs ====================================================

-- ==== paused queues ========================================================
-- 0008's claims know no pause: every paused queue is resumed.
DROP TABLE paused_queues;
-- ==== end: paused queues ===================================================

-- ==== blocked lanes ========================================================
DROP INDEX ledger_lanes_blocked_idx;
-- ==== end: blocked lanes ===================================================

-- ==== attempt series ========================================================
-- 0008 counts every failed or lost attempt of a run against max_attempts. A
-- run retried under 0009 keeps the budget it has left: its max_attempts
-- grows by the failures before its series (at most 1000, the rule's bound;
-- a run past it keeps 1000 and may fail sooner than 0009 would have let it).
-- retry_run's calls are forgotten: 0008 cannot answer them, and a repeat
-- after upgrading again is decided afresh.
DELETE FROM calls AS c
WHERE c.function_name = 'retry_run';
ALTER TABLE calls
DROP CONSTRAINT calls_outcome,
ADD CONSTRAINT calls_outcome CHECK (
    (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
    OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
);

CREATE FUNCTION _runs_rules(
    p_run_id text,
    p_queue text,
    p_status text,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_wake_at timestamptz,
    p_payload_retention text,
    p_max_attempts integer,
    p_attempt_count integer,
    p_concurrency_key text,
    p_key_position bigint,
    p_key_held boolean,
    p_result jsonb,
    p_ledger_seq bigint
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT (p_attempt_count >= 0) THEN 'runs_attempt_count'
        WHEN NOT (p_status <> 'completed' OR p_result IS NOT NULL)
            THEN 'runs_completed_has_result'
        WHEN NOT (
            (p_status IN ('completed', 'failed', 'cancelled'))
            = (p_finished_at IS NOT NULL)
        ) THEN 'runs_finished_iff_terminal'
        WHEN NOT (
            NOT p_key_held OR (p_concurrency_key IS NOT NULL AND p_status = 'queued')
        ) THEN 'runs_key_held_only_queued'
        WHEN NOT ((p_concurrency_key IS NULL) = (p_key_position IS NULL))
            THEN 'runs_key_position_iff_key'
        WHEN NOT (p_ledger_seq >= 0) THEN 'runs_ledger_seq'
        WHEN NOT (p_max_attempts BETWEEN 1 AND 1000) THEN 'runs_max_attempts'
        WHEN NOT (p_payload_retention IN ('keep', 'drop_on_delivery'))
            THEN 'runs_payload_retention'
        WHEN NOT (length(p_queue) BETWEEN 1 AND 200) THEN 'runs_queue_length'
        WHEN NOT (length(p_run_id) BETWEEN 1 AND 200) THEN 'runs_run_id_length'
        WHEN NOT (p_status NOT IN ('running', 'waiting') OR p_attempt_count >= 1)
            THEN 'runs_started_has_attempt'
        WHEN NOT (
            p_status IN (
                'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
            )
        ) THEN 'runs_status'
        WHEN NOT ((p_status = 'waiting') = (p_wait IS NOT NULL))
            THEN 'runs_wait_iff_waiting'
        WHEN NOT (p_wake_at IS NULL OR p_status = 'waiting')
            THEN 'runs_wake_at_only_waiting'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'runs';
END;
$$;

COMMENT ON FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint
) IS
'The row rules of runs (the runs_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

ALTER TABLE runs DROP CONSTRAINT runs_rules;

UPDATE runs AS r
SET max_attempts = least(1000, r.max_attempts + f.spent)
FROM (
    SELECT
        a.run_id,
        count(*)::integer AS spent
    FROM runs AS s
    INNER JOIN attempts AS a ON s.run_id = a.run_id
    WHERE s.series_start > 0 AND a.attempt <= s.series_start AND a.status IN ('failed', 'lost')
    GROUP BY a.run_id
) AS f
WHERE r.run_id = f.run_id;

ALTER TABLE runs
DROP COLUMN series_start,
ADD CONSTRAINT runs_rules CHECK (
    _runs_rules(
        run_id, queue, status, finished_at, wait, wake_at, payload_retention,
        max_attempts, attempt_count, concurrency_key, key_position, key_held,
        result, ledger_seq
    )
);

DROP FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint, integer
);
-- ==== end: attempt series ===================================================

-- ==== operators' listings ==================================================
DROP INDEX runs_key_list_idx;
DROP INDEX runs_list_idx;
-- ==== end: operators' listings =============================================
