-- Revision 0009, table changes. Each change has its own section, delimited
-- by a header and an end line, so that sections written separately merge
-- side by side.

-- ==== operators' listings ==================================================
-- list_runs and purge_runs read runs by (queue, status, created_at) and by
-- (concurrency_key, created_at), leaving out running runs so that a claim
-- writes no entry (plpgsql/schema/02_runs.sql). Built inside the migration's
-- transaction: writers of runs wait for the build (one pass over the table).
CREATE INDEX runs_list_idx ON runs (queue, status, created_at, run_id) INCLUDE (finished_at)
WHERE status <> 'running';

CREATE INDEX runs_key_list_idx ON runs (concurrency_key, created_at, run_id)
WHERE concurrency_key IS NOT NULL AND status <> 'running';
-- ==== end: operators' listings =============================================

-- ==== attempt series ========================================================
-- retry_run starts a new attempt series for an ended run: runs.series_start
-- (plpgsql/schema/02_runs.sql) is the attempt number after which failures
-- count against max_attempts; 0 for every existing run, whose attempts are
-- all its first series, so nothing changes for them. The rules of a run gain
-- runs_series_start (0 <= series_start <= attempt_count): _runs_rules takes
-- one more argument, so the new function replaces the old one under the
-- same constraint name. The constraint is added valid (one scan of runs
-- inside the migration's transaction): every row has series_start 0.
-- calls records retry_run's replays.
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
    p_ledger_seq bigint,
    p_series_start integer
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
        WHEN NOT (p_series_start BETWEEN 0 AND p_attempt_count) THEN 'runs_series_start'
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
    text, bigint, boolean, jsonb, bigint, integer
) IS
'The row rules of runs (the runs_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

ALTER TABLE runs
ADD COLUMN series_start integer NOT NULL DEFAULT 0,
DROP CONSTRAINT runs_rules,
ADD CONSTRAINT runs_rules CHECK (
    _runs_rules(
        run_id, queue, status, finished_at, wait, wake_at, payload_retention,
        max_attempts, attempt_count, concurrency_key, key_position, key_held,
        result, ledger_seq, series_start
    )
);

DROP FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint
);

ALTER TABLE calls
DROP CONSTRAINT calls_outcome,
ADD CONSTRAINT calls_outcome CHECK (
    (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
    OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
    OR (function_name = 'retry_run' AND outcome = 'retried')
);
-- ==== end: attempt series ===================================================

-- ==== blocked lanes ========================================================
-- list_blocked_heads and requeue_blocked_heads read the blocked lanes by
-- run (plpgsql/schema/06_ledger.sql). Few rows: a lane is blocked only
-- behind a failed head.
CREATE INDEX ledger_lanes_blocked_idx ON ledger_lanes (run_id, lane)
WHERE blocked;
-- ==== end: blocked lanes ===================================================

-- ==== paused queues ========================================================
-- pause_queue and resume_queue; claims skip a queue listed here
-- (plpgsql/schema/09_paused_queues.sql). Empty after the upgrade.
CREATE TABLE paused_queues (
    queue text PRIMARY KEY,
    reason text,
    paused_by text,
    paused_at timestamptz NOT NULL,
    CONSTRAINT paused_queues_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT paused_queues_reason_length CHECK (reason IS NULL OR length(reason) <= 2000),
    CONSTRAINT paused_queues_paused_by_length CHECK (
        paused_by IS NULL OR length(paused_by) BETWEEN 1 AND 200
    )
) WITH (autovacuum_vacuum_threshold = 1, autovacuum_vacuum_scale_factor = 0);
-- ==== end: paused queues ===================================================

-- ==== purging runs =========================================================
-- purge_runs deletes a purged run's calls rows by run (schema/07_calls.sql).
-- The trigger that deletes a deleted run's ledger rows finds them by key,
-- a probe per run, whatever the statistics (schema/08_run_history.sql):
-- the trigger keeps its function, whose body changes.
CREATE INDEX calls_run_id_idx ON calls (run_id);

CREATE OR REPLACE FUNCTION _runs_deleted()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_tids tid[];
BEGIN
    -- Each table in two steps: the deleted runs' rows found by their key, a
    -- probe per run (OFFSET 0 keeps the lateral subquery a probe: flattened
    -- into a join, a plan made without statistics read the whole table),
    -- then deleted by ctid.
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_events AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_events AS l WHERE l.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_lanes AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_lanes AS ll WHERE ll.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_wakeups AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_wakeups AS w WHERE w.ctid = ANY(v_tids);
    RETURN NULL;
END;
$$;
-- ==== end: purging runs ====================================================

-- ==== trace context ========================================================
-- runs.trace_context: the W3C trace context a producer's tracing gave the
-- run at enqueue (plpgsql/schema/02_runs.sql, _internal/trace_context.sql),
-- read by tracing workers and relays through run_trace_context. Nullable
-- with no default: adding it rewrites nothing, and every existing run has
-- none.
ALTER TABLE runs ADD COLUMN trace_context jsonb;
-- ==== end: trace context ===================================================

-- ==== schedules ============================================================
-- Periodic runs: upsert_schedule declares, enqueue_due_schedules enqueues
-- the due slots (plpgsql/schema/10_schedules.sql). Empty after the upgrade.
CREATE TABLE schedules (
    name text PRIMARY KEY,
    cron text NOT NULL,
    time_zone text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    concurrency_key text,
    missed text NOT NULL,
    enabled boolean NOT NULL,
    next_slot_at timestamptz,
    last_slot_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT schedules_name_length CHECK (length(name) BETWEEN 1 AND 160),
    CONSTRAINT schedules_cron_length CHECK (length(cron) BETWEEN 1 AND 200),
    CONSTRAINT schedules_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT schedules_concurrency_key_length CHECK (
        concurrency_key IS NULL OR length(concurrency_key) BETWEEN 1 AND 200
    ),
    CONSTRAINT schedules_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT schedules_missed CHECK (missed IN ('catch_up', 'skip')),
    CONSTRAINT schedules_enabled_has_next_slot CHECK (enabled = (next_slot_at IS NOT NULL)),
    CONSTRAINT schedules_slots_in_order CHECK (next_slot_at > last_slot_at)
);

CREATE INDEX schedules_due_idx ON schedules (next_slot_at, name)
WHERE next_slot_at IS NOT NULL;
-- ==== end: schedules =======================================================

-- ==== queue activity =======================================================
-- The per-minute rollup of runs ended completed / failed, by queue, that
-- record_queue_activity writes and queue_overview reads, and its watermark
-- (plpgsql/schema/11_queue_activity.sql). Empty after the upgrade: the
-- first record_queue_activity finalizes the last hour from the ledger.
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

CREATE TABLE queue_activity_watermark (
    singleton boolean PRIMARY KEY DEFAULT TRUE,
    final_before timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT queue_activity_watermark_singleton CHECK (singleton),
    CONSTRAINT queue_activity_watermark_whole_minute CHECK (
        final_before = date_bin('1 minute', final_before, timestamptz '2000-01-01 00:00:00+00')
    )
);
-- ==== end: queue activity ==================================================

-- ==== lock rows ============================================================
-- The rows runrelay serialises on instead of advisory locks, which any login
-- could take (plpgsql/schema/12_locks.sql). Every key a run has gets its row
-- now, so a try-lock on an existing run's key finds its row.
CREATE TABLE concurrency_keys (
    key text PRIMARY KEY
);

REVOKE ALL ON TABLE concurrency_keys FROM public;

INSERT INTO concurrency_keys (key)
SELECT DISTINCT r.concurrency_key
FROM runs AS r
WHERE r.concurrency_key IS NOT NULL;

CREATE TABLE call_locks (
    call_id uuid PRIMARY KEY
);

REVOKE ALL ON TABLE call_locks FROM public;
-- ==== end: lock rows =======================================================

-- ==== shard ownership ======================================================
-- Which runs a shard of a sharded install may create
-- (plpgsql/schema/13_shard_ownership.sql). Empty after the upgrade (an
-- unsharded install checks nothing); `runrelay migrate` against a proxy
-- writes each shard's row.
CREATE TABLE shard_ownership (
    singleton boolean PRIMARY KEY DEFAULT TRUE,
    shard integer NOT NULL,
    partition_count integer NOT NULL,
    partitions integer[] NOT NULL,
    CONSTRAINT shard_ownership_singleton CHECK (singleton),
    CONSTRAINT shard_ownership_shard CHECK (shard BETWEEN 0 AND 32767),
    CONSTRAINT shard_ownership_partition_count CHECK (
        partition_count BETWEEN 1 AND 32768
        AND partition_count & (partition_count - 1) = 0
    ),
    CONSTRAINT shard_ownership_partitions CHECK (
        cardinality(partitions) <= partition_count
    )
);
-- ==== end: shard ownership =================================================

-- ==== purge lock order =====================================================
-- Deleting runs locks their lanes before deleting their ledger events, in
-- the lane order relays follow (plpgsql/schema/08_run_history.sql): the
-- trigger keeps its function, whose body changes again, with the deletion of
-- the run's delivery records (the table is created by the "delivery
-- records" section below; a PL/pgSQL body names it before it exists). The
-- downgrade's "purging runs" section puts back 0008's body.
CREATE OR REPLACE FUNCTION _runs_deleted()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_tids tid[];
BEGIN
    -- The deleted runs' lanes are locked first, in the lane order of
    -- custody.sql (run_id COLLATE "C", lane), waiting for a relay that holds
    -- one. A relay takes a lane, then its events: deleting the events first
    -- would hold them while waiting for the lane, and a relay writing them
    -- under that lane (an ack) would close a cycle (40P01). Found by run_id
    -- (the primary key's prefix), not ctid: a lane the relay updated before
    -- letting go is re-checked in its new version, which a ctid misses.
    PERFORM 1 FROM ledger_lanes AS ll
    WHERE ll.run_id = ANY(ARRAY(SELECT d.run_id FROM deleted_runs AS d))
    ORDER BY ll.run_id COLLATE "C", ll.lane
    FOR UPDATE OF ll;
    -- Then each table in two steps: the deleted runs' rows found by their
    -- key, a probe per run (OFFSET 0 keeps the lateral subquery a probe:
    -- flattened into a join, a plan made without statistics read the whole
    -- table), then deleted by ctid. Each step reads the ctids afresh, after
    -- the lane locks: a lane a relay updated while the purge waited for it
    -- has a new row version, which a ctid read before the wait would miss.
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_events AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_events AS l WHERE l.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_deliveries AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_deliveries AS l WHERE l.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_lanes AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_lanes AS ll WHERE ll.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_wakeups AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_wakeups AS w WHERE w.ctid = ANY(v_tids);
    RETURN NULL;
END;
$$;
-- ==== end: purge lock order ================================================

-- ==== cancel reason ========================================================
-- A cancelled run keeps the reason it was cancelled for (the marker that
-- carried it is deleted when the cancellation applies).
ALTER TABLE runs ADD COLUMN cancel_reason text;
-- ==== end: cancel reason ===================================================

-- ==== tasks ================================================================
-- A run may name the task that handles it; a claim's tasks filter reads the
-- runnable runs of each (task, queue) from their own index range.
ALTER TABLE runs ADD COLUMN task text;
CREATE INDEX runs_claim_task_idx ON runs (task, queue, priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held AND task IS NOT NULL;
-- ==== end: tasks ===========================================================

-- ==== skipped events =======================================================
-- An operator can end a permanently failed head as skipped, so its lane
-- delivers its successors (skip_ledger_events); the event keeps why and who.
ALTER TABLE ledger_events
ADD COLUMN skipped_at timestamptz,
ADD COLUMN skip_reason text,
ADD COLUMN skipped_by text,
ADD COLUMN skip_call_id uuid;
-- calls records skip_ledger_events' replays; a not_blocked answer keeps the
-- head it found in calls.reply (nullable, no default: nothing is rewritten).
ALTER TABLE calls
ADD COLUMN reply jsonb,
DROP CONSTRAINT calls_outcome,
ADD CONSTRAINT calls_outcome CHECK (
    (function_name = 'signal_run' AND outcome IN ('resumed', 'stored', 'terminal'))
    OR (function_name = 'cancel_run' AND outcome IN ('cancelled', 'cancel_requested'))
    OR (function_name = 'retry_run' AND outcome = 'retried')
    OR (function_name = 'skip_ledger_events' AND outcome IN ('skipped', 'not_blocked'))
),
ADD CONSTRAINT calls_reply CHECK (reply IS NULL OR outcome = 'not_blocked');
-- ==== end: skipped events ==================================================

-- ==== live processes =======================================================
-- list_processes reads the attempts ended in the last hour and the leased
-- lanes by index (plpgsql/schema/03_attempts.sql, 06_ledger.sql). Built
-- inside the migration's transaction: writers wait for the builds.
CREATE INDEX attempts_finished_idx ON attempts (finished_at)
WHERE finished_at IS NOT NULL;

CREATE INDEX ledger_lanes_lease_owner_idx ON ledger_lanes (lease_owner)
WHERE lease_owner IS NOT NULL;
-- ==== end: live processes ==================================================

-- ==== durable steps ========================================================
-- record_step stores a run's steps (plpgsql/schema/14_steps.sql), which
-- every claim returns; empty after the upgrade. settings.step_events turns
-- the step.recorded events off (on by default; adding it rewrites nothing).
CREATE TABLE steps (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step text NOT NULL,
    position integer NOT NULL,
    result jsonb NOT NULL,
    attempt integer NOT NULL,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, step),
    CONSTRAINT steps_position_unique UNIQUE (run_id, position),
    CONSTRAINT steps_step_length CHECK (length(step) BETWEEN 1 AND 200),
    CONSTRAINT steps_position_positive CHECK (position >= 1),
    CONSTRAINT steps_attempt_positive CHECK (attempt >= 1)
);
ALTER TABLE settings ADD COLUMN step_events boolean NOT NULL DEFAULT TRUE;
-- ==== end: durable steps ===================================================

-- ==== purge plans ==========================================================
-- The trigger that deletes a deleted run's ledger rows looks them up by
-- run_id, a probe per run; with statistics taken while ledger_events was
-- small (a young install) its plan was a sequential scan of the whole table
-- per run. It runs with enable_seqscan off, as the ledger functions do
-- (plpgsql/schema/08_run_history.sql).
ALTER FUNCTION _runs_deleted() SET enable_seqscan = off;
-- ==== end: purge plans =====================================================

-- ==== lane rules ===========================================================
-- The five CHECK constraints of ledger_lanes become one CHECK that calls
-- _ledger_lanes_rules (plpgsql/schema/06_ledger.sql), as revision 0008 did
-- for runs, attempts and ledger_events: PostgreSQL 15 rebuilds every CHECK
-- expression of a table for each statement that writes it. The rules and
-- their names are unchanged: a lane that breaks one fails as before, with
-- SQLSTATE 23514 and the rule's name. The function is state, not code (the
-- constraint depends on it). The new constraint is added valid (one scan of
-- the table in the migration's transaction); every existing row passed the
-- same rules.
CREATE FUNCTION _ledger_lanes_rules(
    p_lane text,
    p_head_seq bigint,
    p_available_at timestamptz,
    p_blocked boolean,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_leased_through bigint,
    p_lease_call_id uuid,
    p_batch_id uuid,
    p_batch_started_at timestamptz,
    p_batch_through bigint
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT (p_available_at IS NULL OR p_head_seq IS NOT NULL)
            THEN 'ledger_lanes_available_has_head'
        WHEN NOT (
            (p_batch_id IS NULL) = (p_batch_started_at IS NULL)
            AND (p_batch_id IS NULL) = (p_batch_through IS NULL)
        ) THEN 'ledger_lanes_batch'
        WHEN NOT (NOT p_blocked OR p_available_at IS NULL)
            THEN 'ledger_lanes_blocked_not_available'
        WHEN NOT (p_lane IN ('lifecycle', 'observability')) THEN 'ledger_lanes_lane'
        WHEN NOT (
            (p_lease_owner IS NULL) = (p_lease_expires_at IS NULL)
            AND (p_lease_owner IS NULL) = (p_leased_through IS NULL)
            AND (p_lease_call_id IS NULL OR p_lease_owner IS NOT NULL)
        ) THEN 'ledger_lanes_lease'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "ledger_lanes" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'ledger_lanes';
END;
$$;

COMMENT ON FUNCTION _ledger_lanes_rules(
    text, bigint, timestamptz, boolean, text, timestamptz, bigint, uuid, uuid,
    timestamptz, bigint
) IS
'The row rules of ledger_lanes (the ledger_lanes_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

ALTER TABLE ledger_lanes
DROP CONSTRAINT ledger_lanes_lane,
DROP CONSTRAINT ledger_lanes_blocked_not_available,
DROP CONSTRAINT ledger_lanes_available_has_head,
DROP CONSTRAINT ledger_lanes_lease,
DROP CONSTRAINT ledger_lanes_batch,
ADD CONSTRAINT ledger_lanes_rules CHECK (
    _ledger_lanes_rules(
        lane, head_seq, available_at, blocked, lease_owner, lease_expires_at,
        leased_through, lease_call_id, batch_id, batch_started_at, batch_through
    )
);
-- ==== end: lane rules ======================================================

-- ==== row rules without a path ============================================
-- The rules functions of runs, attempts and ledger_events no longer pin
-- their search_path (_ledger_lanes_rules, above, is created without it): the
-- SET clause saved and restored the setting for every row a CHECK checked,
-- a tenth of an acknowledgement of 100 events. They read their arguments
-- only and use pg_catalog's operators, so no path changes what they do
-- (plpgsql/schema/02_runs.sql says why in full).
ALTER FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint, integer
) RESET search_path;
ALTER FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
) RESET search_path;
ALTER FUNCTION _ledger_events_rules(
    text, text, text, bigint, timestamptz, text, timestamptz, uuid, timestamptz,
    integer, boolean, uuid
) RESET search_path;
-- ==== end: row rules without a path =======================================

-- ==== notification kinds ===================================================
-- settings.notifications: the kinds of notification the install sends
-- (every notification goes through _notifying); all five by default, as
-- before, so adding it changes no behaviour and rewrites nothing.
ALTER TABLE settings
ADD COLUMN notifications text[] NOT NULL
DEFAULT ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel'],
ADD CONSTRAINT settings_notifications CHECK (
    notifications <@ ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel']
);
-- ==== end: notification kinds ==============================================

-- ==== explicit delivery keys ===============================================
-- The unique index on delivery keys holds only the keys a producer chose: a
-- default key, <run_id>:<seq>, is unique by construction, and an explicit key
-- never has that form (refused since the ledger's first revision), so the
-- engine's events write one index entry fewer (plpgsql/schema/06_ledger.sql).
-- Built inside the migration's transaction: writers of events wait for it.
ALTER TABLE ledger_events DROP CONSTRAINT ledger_delivery_key_unique;
CREATE UNIQUE INDEX ledger_delivery_key_unique ON ledger_events (delivery_key)
WHERE delivery_key <> run_id || ':' || seq::text;
-- ==== end: explicit delivery keys ==========================================

-- ==== delivery records =====================================================
-- A relay's acknowledgement is recorded once for the prefix it delivered, as
-- a row of ledger_deliveries, instead of on each event row
-- (plpgsql/schema/06_ledger.sql). Events delivered before this revision
-- keep their delivery in their own columns, which readers take first
-- (_delivery): nothing is rewritten. The event heap no longer keeps room for
-- the updates deliveries made (fillfactor 50): pages written from now on are
-- packed full. The triggers that take a run's ledger rows with it take its
-- deliveries too (_runs_deleted's body is the "purge lock order" section's).
-- A relay's acknowledgement: one row for the unbroken prefix of a lane's
-- pending tail it delivered (first_seq .. last_seq), however many events it
-- holds. Writing one row here instead of updating each event row is what
-- makes an acknowledgement of 100 events cost about what one costs, and
-- leaves the event rows as they were written.
--
-- delivered_at, delivered_by: when and by which relay; call_id: the
-- ack_ledger call (what its replay looks up). batch_id, batch_started_at:
-- the frozen batch the events up to batch_through were members of (the
-- lane's, when the acknowledgement covered some of it).
--
-- Ranges of one lane never overlap (each acknowledges what lay at the head,
-- and the head moves past it), so the delivery of an event is the first row
-- of its lane whose last_seq is at least the event's seq, when that row's
-- first_seq is at most it: a primary-key seek (_delivery, delivery.sql).
-- Rows go with their run (08_run_history.sql) and with their events
-- (prune).
CREATE TABLE ledger_deliveries (
    run_id text NOT NULL,
    lane text NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    delivered_at timestamptz NOT NULL,
    delivered_by text NOT NULL,
    call_id uuid NOT NULL,
    batch_id uuid,
    batch_started_at timestamptz,
    batch_through bigint,
    PRIMARY KEY (run_id, lane, last_seq),
    CONSTRAINT ledger_deliveries_range CHECK (first_seq >= 1 AND first_seq <= last_seq),
    CONSTRAINT ledger_deliveries_batch CHECK (
        (batch_id IS NULL) = (batch_started_at IS NULL)
        AND (batch_id IS NULL) = (batch_through IS NULL)
    ),
    CONSTRAINT ledger_deliveries_lane CHECK (lane IN ('lifecycle', 'observability'))
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- list_processes() (the relays seen in the last hour) and prune() (the
-- deliveries whose events are gone) read deliveries by time.
CREATE INDEX ledger_deliveries_delivered_idx ON ledger_deliveries (delivered_at);

ALTER TABLE ledger_events RESET (fillfactor);

COMMENT ON FUNCTION _runs_deleted() IS
'Trigger: deletes the ledger events, deliveries, lanes and wake-ups of deleted runs (the cascade of the ledger tables).';

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
    IF EXISTS (SELECT FROM ledger_deliveries) THEN
        TRUNCATE ledger_deliveries;
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
-- ==== end: delivery records ================================================
