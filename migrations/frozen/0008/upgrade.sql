-- Revision 0008, table changes. Each change has its own section, delimited
-- by a header and an end line, so that sections written separately merge
-- side by side.

-- ==== row rules of runs and attempts =======================================
-- Revision 0008, the row rules of runs and attempts: each table's CHECK
-- constraints become one CHECK that calls the table's rules function
-- (_runs_rules, _attempts_rules; see plpgsql/schema/02_runs.sql). The rules and
-- their names are unchanged: a row that breaks one fails as before, with
-- SQLSTATE 23514 and the rule's name. The cause is cost: PostgreSQL 15 rebuilds
-- every CHECK expression of a table for each statement that writes it.
--
-- The functions are state, not code: the constraints depend on them, so
-- drop_code keeps them and only this file and downgrade.sql change them.
--
-- The new constraints are added valid (one scan of each table inside the
-- migration's transaction): they enforce exactly the rules the dropped
-- constraints enforced on every row any earlier revision wrote, so every
-- existing row passes.
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

CREATE FUNCTION _attempts_rules(
    p_attempt integer,
    p_status text,
    p_lease_expires_at timestamptz,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_runner_result_received_at timestamptz,
    p_runner_result jsonb,
    p_outcome text,
    p_outcome_op text
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
        WHEN NOT (p_attempt >= 1) THEN 'attempts_attempt'
        WHEN NOT (
            (
                p_status IN (
                    'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
                )
            )
            = (p_finished_at IS NOT NULL)
        ) THEN 'attempts_finished_iff_ended'
        WHEN NOT (
            p_outcome IN (
                'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
                'resumed', 'released'
            )
        ) THEN 'attempts_outcome'
        WHEN NOT ((p_outcome IS NULL) = (p_outcome_op IS NULL))
            THEN 'attempts_outcome_op'
        WHEN NOT (p_runner_result_received_at IS NULL OR p_runner_result IS NOT NULL)
            THEN 'attempts_received_has_result'
        WHEN NOT (p_status <> 'running' OR p_lease_expires_at IS NOT NULL)
            THEN 'attempts_running_has_lease'
        WHEN NOT (
            p_status IN (
                'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
                'resumed', 'released'
            )
        ) THEN 'attempts_status'
        WHEN NOT (p_status <> 'waiting' OR p_wait IS NOT NULL)
            THEN 'attempts_waiting_has_wait'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "attempts" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'attempts';
END;
$$;

COMMENT ON FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
) IS
'The row rules of attempts (the attempts_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

ALTER TABLE runs
DROP CONSTRAINT runs_run_id_length,
DROP CONSTRAINT runs_queue_length,
DROP CONSTRAINT runs_status,
DROP CONSTRAINT runs_finished_iff_terminal,
DROP CONSTRAINT runs_wait_iff_waiting,
DROP CONSTRAINT runs_wake_at_only_waiting,
DROP CONSTRAINT runs_payload_retention,
DROP CONSTRAINT runs_max_attempts,
DROP CONSTRAINT runs_attempt_count,
DROP CONSTRAINT runs_started_has_attempt,
DROP CONSTRAINT runs_key_position_iff_key,
DROP CONSTRAINT runs_key_held_only_queued,
DROP CONSTRAINT runs_completed_has_result,
DROP CONSTRAINT runs_ledger_seq,
ADD CONSTRAINT runs_rules CHECK (
    _runs_rules(
        run_id, queue, status, finished_at, wait, wake_at, payload_retention,
        max_attempts, attempt_count, concurrency_key, key_position, key_held,
        result, ledger_seq
    )
);

ALTER TABLE attempts
DROP CONSTRAINT attempts_attempt,
DROP CONSTRAINT attempts_status,
DROP CONSTRAINT attempts_running_has_lease,
DROP CONSTRAINT attempts_finished_iff_ended,
DROP CONSTRAINT attempts_waiting_has_wait,
DROP CONSTRAINT attempts_received_has_result,
DROP CONSTRAINT attempts_outcome,
DROP CONSTRAINT attempts_outcome_op,
ADD CONSTRAINT attempts_rules CHECK (
    _attempts_rules(
        attempt, status, lease_expires_at, finished_at, wait,
        runner_result_received_at, runner_result, outcome, outcome_op
    )
);
-- ==== end: row rules of runs and attempts ==================================

-- ==== ledger lease watermark ===============================================
-- The lease of a lane's claimed events moves from the event rows to the lane
-- row (schema/06_ledger.sql), so leasing a batch writes one lane row, and
-- delivery writes no indexed column (a HOT update). The events table becomes
-- ledger_events; `ledger` is now a view (views/ledger.sql, installed with
-- this revision's code) that reads each event's state and lease from its
-- lane, with the columns and meanings the table had.
--
-- 0007's code is still installed while this runs; its ledger_stats view reads
-- ledger.state, which is dropped below, so the view goes first (this
-- revision's code creates it again).
DROP VIEW ledger_stats;

ALTER TABLE ledger_lanes
ADD COLUMN delivered_below bigint NOT NULL DEFAULT 0,
ADD COLUMN lease_owner text,
ADD COLUMN lease_expires_at timestamptz,
ADD COLUMN leased_through bigint,
ADD COLUMN lease_call_id uuid,
ADD COLUMN batch_id uuid,
ADD COLUMN batch_started_at timestamptz,
ADD COLUMN batch_through bigint;

-- Where a scan of an empty lane starts: past its last event.
UPDATE ledger_lanes AS ll
SET delivered_below = coalesce(ll.head_seq, m.last_seq + 1, 0)
FROM (
    SELECT
        l.run_id,
        l.lane,
        max(l.seq) AS last_seq
    FROM ledger AS l
    GROUP BY l.run_id, l.lane
) AS m
WHERE ll.run_id = m.run_id AND ll.lane = m.lane;

-- A live lease (or a lapsed one nobody took over): the unbroken run of
-- leased events from the lane's head with the head's owner becomes the
-- lane's lease, until the earliest of their expiries, with the head's call.
-- A leased event behind a pending one (0007 let a relay release or fail the
-- head of its batch alone) could not be acknowledged before that one: it is
-- pending from now on, as after a release.
WITH heads AS (
    SELECT
        ll.run_id,
        ll.lane,
        h.seq,
        h.lease_owner,
        h.call_id
    FROM ledger_lanes AS ll
    INNER JOIN ledger AS h ON ll.run_id = h.run_id AND ll.lane = h.lane AND ll.head_seq = h.seq
    WHERE h.state = 'leased'
),

leased AS (
    SELECT
        h.run_id,
        h.lane,
        h.lease_owner,
        h.call_id,
        max(l.seq) AS leased_through,
        min(l.lease_expires_at) AS lease_expires_at
    FROM heads AS h
    CROSS JOIN
        LATERAL (
            SELECT min(g.seq) AS stop_seq
            FROM ledger AS g
            WHERE
                g.run_id = h.run_id AND g.lane = h.lane AND g.seq > h.seq
                AND (g.state <> 'leased' OR g.lease_owner <> h.lease_owner)
        ) AS s
    INNER JOIN ledger AS l
        ON
            h.run_id = l.run_id AND h.lane = l.lane
            AND h.seq <= l.seq AND (s.stop_seq IS NULL OR s.stop_seq > l.seq)
    GROUP BY h.run_id, h.lane, h.lease_owner, h.call_id
)

UPDATE ledger_lanes AS ll
SET
    lease_owner = x.lease_owner,
    lease_expires_at = x.lease_expires_at,
    leased_through = x.leased_through,
    lease_call_id = x.call_id,
    available_at = x.lease_expires_at
FROM leased AS x
WHERE ll.run_id = x.run_id AND ll.lane = x.lane;

-- The frozen batch of a lane's head: its undelivered members from the head.
-- (A batch always starts at the head it was claimed from, and only the
-- lane's head batch has undelivered members.)
UPDATE ledger_lanes AS ll
SET
    batch_id = b.batch_id,
    batch_started_at = b.batch_started_at,
    batch_through = b.batch_through
FROM (
    SELECT
        h.run_id,
        h.lane,
        h.batch_id,
        h.batch_started_at,
        max(l.seq) AS batch_through
    FROM ledger_lanes AS t
    INNER JOIN ledger AS h ON t.run_id = h.run_id AND t.lane = h.lane AND t.head_seq = h.seq
    INNER JOIN ledger AS l
        ON
            h.run_id = l.run_id AND h.lane = l.lane AND h.batch_id = l.batch_id
            AND l.state <> 'delivered'
    WHERE h.batch_id IS NOT NULL AND h.state <> 'delivered'
    GROUP BY h.run_id, h.lane, h.batch_id, h.batch_started_at
) AS b
WHERE ll.run_id = b.run_id AND ll.lane = b.lane;

ALTER TABLE ledger_lanes
ADD CONSTRAINT ledger_lanes_lease CHECK (
    (lease_owner IS NULL) = (lease_expires_at IS NULL)
    AND (lease_owner IS NULL) = (leased_through IS NULL)
    AND (lease_call_id IS NULL OR lease_owner IS NOT NULL)
),
ADD CONSTRAINT ledger_lanes_batch CHECK (
    (batch_id IS NULL) = (batch_started_at IS NULL)
    AND (batch_id IS NULL) = (batch_through IS NULL)
);

CREATE INDEX ledger_lanes_lease_call_idx ON ledger_lanes (lease_call_id)
WHERE lease_call_id IS NOT NULL;

-- The events keep what a lease does not change. An undelivered event's
-- batch is its lane's now; a delivered one keeps the batch it was delivered
-- in. A local acknowledgement's call is indexed apart, for claim replays.
ALTER TABLE ledger
DROP CONSTRAINT ledger_state,
DROP CONSTRAINT ledger_leased_has_owner,
DROP CONSTRAINT ledger_delivered_iff_at,
DROP CONSTRAINT ledger_failed_iff_at,
DROP CONSTRAINT ledger_acked_locally_delivered,
ADD COLUMN local_ack_call_id uuid;

UPDATE ledger AS l
SET batch_id = NULL, batch_started_at = NULL
WHERE l.state <> 'delivered' AND l.batch_id IS NOT NULL;

UPDATE ledger AS l
SET call_id = NULL
WHERE l.state <> 'delivered' AND l.call_id IS NOT NULL;

UPDATE ledger AS l
SET local_ack_call_id = l.call_id
WHERE l.acked_locally AND l.call_id IS NOT NULL;

DROP INDEX ledger_pending_idx;
DROP INDEX ledger_delivered_idx;
DROP INDEX ledger_call_id_idx;

ALTER TABLE ledger
DROP COLUMN state,
DROP COLUMN lease_owner,
DROP COLUMN lease_expires_at;

ALTER TABLE ledger RENAME TO ledger_events;
ALTER INDEX ledger_pkey RENAME TO ledger_events_pkey;
ALTER SEQUENCE ledger_event_id_seq RENAME TO ledger_events_event_id_seq;
ALTER TABLE ledger_events RENAME CONSTRAINT ledger_run_id_fkey TO ledger_events_run_id_fkey;
-- PostgreSQL 18 names NOT NULL constraints after their table
-- (ledger_lane_not_null); a table created as ledger_events has
-- ledger_events_lane_not_null. Earlier versions keep no such constraint rows,
-- so there this renames nothing.
DO $rename$
DECLARE
    v_name text;
BEGIN
    FOR v_name IN
        SELECT c.conname FROM pg_catalog.pg_constraint AS c
        WHERE c.conrelid = 'ledger_events'::regclass AND c.contype = 'n' AND c.conname LIKE 'ledger\_%\_not\_null'
    LOOP
        EXECUTE format('ALTER TABLE ledger_events RENAME CONSTRAINT %I TO %I', v_name, 'ledger_events_' || substr(v_name, 8));
    END LOOP;
END
$rename$;

ALTER TABLE ledger_events
ADD CONSTRAINT ledger_delivered_not_failed CHECK (
    delivered_at IS NULL OR failed_at IS NULL
),
ADD CONSTRAINT ledger_delivered_by CHECK (
    (delivered_at IS NULL) = (delivered_by IS NULL)
),
ADD CONSTRAINT ledger_batch_delivered CHECK (
    batch_id IS NULL OR delivered_at IS NOT NULL
),
ADD CONSTRAINT ledger_acked_locally_delivered CHECK (
    NOT acked_locally OR delivered_at IS NOT NULL
),
ADD CONSTRAINT ledger_local_ack_call CHECK (
    local_ack_call_id IS NULL OR acked_locally
);

CREATE INDEX ledger_lane_seq_idx ON ledger_events (run_id, lane, seq);

CREATE INDEX ledger_created_idx ON ledger_events (created_at, event_id);

CREATE INDEX ledger_local_ack_call_idx ON ledger_events (local_ack_call_id)
WHERE local_ack_call_id IS NOT NULL;
-- ==== end: ledger lease watermark ==========================================

-- ==== row rules of ledger_events ===========================================
-- As the row rules of runs and attempts above: the event table's CHECK
-- constraints (as the lease watermark section leaves them) become one CHECK
-- calling _ledger_events_rules (plpgsql/schema/06_ledger.sql), with the same
-- rules, names and errors. Every lifecycle event is a statement that writes
-- this table, two per job. Added valid: every existing row passed the same
-- rules a moment ago.
CREATE FUNCTION _ledger_events_rules(
    p_lane text,
    p_type text,
    p_delivery_key text,
    p_seq bigint,
    p_delivered_at timestamptz,
    p_delivered_by text,
    p_failed_at timestamptz,
    p_batch_id uuid,
    p_batch_started_at timestamptz,
    p_delivery_attempts integer,
    p_acked_locally boolean,
    p_local_ack_call_id uuid
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
        WHEN NOT (NOT p_acked_locally OR p_delivered_at IS NOT NULL)
            THEN 'ledger_acked_locally_delivered'
        WHEN NOT (p_batch_id IS NULL OR p_delivered_at IS NOT NULL)
            THEN 'ledger_batch_delivered'
        WHEN NOT ((p_batch_id IS NULL) = (p_batch_started_at IS NULL))
            THEN 'ledger_batch_started'
        WHEN NOT ((p_delivered_at IS NULL) = (p_delivered_by IS NULL))
            THEN 'ledger_delivered_by'
        WHEN NOT (p_delivered_at IS NULL OR p_failed_at IS NULL)
            THEN 'ledger_delivered_not_failed'
        WHEN NOT (p_delivery_attempts >= 0) THEN 'ledger_delivery_attempts'
        WHEN NOT (length(p_delivery_key) BETWEEN 1 AND 400)
            THEN 'ledger_delivery_key_length'
        WHEN NOT (p_lane IN ('lifecycle', 'observability')) THEN 'ledger_lane'
        WHEN NOT (p_local_ack_call_id IS NULL OR p_acked_locally)
            THEN 'ledger_local_ack_call'
        WHEN NOT (p_seq >= 1) THEN 'ledger_seq_positive'
        WHEN NOT (length(p_type) BETWEEN 1 AND 200) THEN 'ledger_type_length'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "ledger_events" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'ledger_events';
END;
$$;

COMMENT ON FUNCTION _ledger_events_rules(
    text, text, text, bigint, timestamptz, text, timestamptz, uuid, timestamptz,
    integer, boolean, uuid
) IS
'The row rules of ledger_events (the ledger_events_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

ALTER TABLE ledger_events
DROP CONSTRAINT ledger_lane,
DROP CONSTRAINT ledger_type_length,
DROP CONSTRAINT ledger_delivery_key_length,
DROP CONSTRAINT ledger_seq_positive,
DROP CONSTRAINT ledger_delivered_not_failed,
DROP CONSTRAINT ledger_delivered_by,
DROP CONSTRAINT ledger_batch_started,
DROP CONSTRAINT ledger_batch_delivered,
DROP CONSTRAINT ledger_delivery_attempts,
DROP CONSTRAINT ledger_acked_locally_delivered,
DROP CONSTRAINT ledger_local_ack_call,
ADD CONSTRAINT ledger_events_rules CHECK (
    _ledger_events_rules(
        lane, type, delivery_key, seq, delivered_at, delivered_by, failed_at,
        batch_id, batch_started_at, delivery_attempts, acked_locally,
        local_ack_call_id
    )
);
-- ==== end: row rules of ledger_events ======================================

-- ==== ledger tables without foreign keys ===================================
-- The ledger tables drop their foreign keys to runs: every event is written
-- under its run's row lock or with its new run, and the keys' KEY SHARE
-- checks were the largest single cost of an enqueue. Statement triggers on
-- runs delete (or truncate) the ledger rows of deleted runs, as the keys'
-- ON DELETE CASCADE did (plpgsql/schema/08_run_history.sql).
ALTER TABLE ledger_events DROP CONSTRAINT ledger_events_run_id_fkey;
ALTER TABLE ledger_lanes DROP CONSTRAINT ledger_lanes_run_id_fkey;
ALTER TABLE ledger_wakeups DROP CONSTRAINT ledger_wakeups_run_id_fkey;

CREATE FUNCTION _runs_deleted()
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

COMMENT ON FUNCTION _runs_deleted() IS
'Trigger: deletes the ledger events, lanes and wake-ups of deleted runs (the cascade of the ledger tables).';

CREATE TRIGGER runs_deleted
AFTER DELETE ON runs
REFERENCING OLD TABLE AS deleted_runs
FOR EACH STATEMENT
EXECUTE FUNCTION _runs_deleted();

CREATE FUNCTION _runs_truncated()
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

CREATE TRIGGER runs_truncated
AFTER TRUNCATE ON runs
FOR EACH STATEMENT
EXECUTE FUNCTION _runs_truncated();
-- ==== end: ledger tables without foreign keys ==============================

-- ==== fillfactor of ledger_events ==========================================
-- Room on each page for the HOT update of a delivery: at 90 about one
-- delivery in ten of a batch of 100 found it, at 50 nearly all do. Applies
-- to pages filled from now on.
ALTER TABLE ledger_events SET (fillfactor = 50);
-- ==== end: fillfactor of ledger_events =====================================
