-- Undo revision 0008's table changes. Each change has its own section,
-- delimited by a header and an end line, so that sections written
-- separately merge side by side.

-- ==== fillfactor of ledger_events ==========================================
ALTER TABLE ledger_events SET (fillfactor = 90);
-- ==== end: fillfactor of ledger_events =====================================

-- ==== ledger tables without foreign keys ===================================
-- The foreign keys come back (validated: the triggers left no ledger row
-- of a deleted run), and the triggers that stood in for them go.
DROP TRIGGER runs_truncated ON runs;
DROP TRIGGER runs_deleted ON runs;
DROP FUNCTION _runs_truncated();
DROP FUNCTION _runs_deleted();
ALTER TABLE ledger_events
ADD CONSTRAINT ledger_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (run_id) ON DELETE CASCADE;
ALTER TABLE ledger_lanes
ADD CONSTRAINT ledger_lanes_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (run_id) ON DELETE CASCADE;
ALTER TABLE ledger_wakeups
ADD CONSTRAINT ledger_wakeups_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (run_id) ON DELETE CASCADE;
-- ==== end: ledger tables without foreign keys ==============================

-- ==== row rules of ledger_events ===========================================
-- The separate CHECK constraints come back, as the lease watermark section
-- below expects to find them; then the rules function goes.
ALTER TABLE ledger_events
DROP CONSTRAINT ledger_events_rules,
ADD CONSTRAINT ledger_lane CHECK (lane IN ('lifecycle', 'observability')),
ADD CONSTRAINT ledger_type_length CHECK (length(type) BETWEEN 1 AND 200),
ADD CONSTRAINT ledger_delivery_key_length CHECK (
    length(delivery_key) BETWEEN 1 AND 400
),
ADD CONSTRAINT ledger_seq_positive CHECK (seq >= 1),
ADD CONSTRAINT ledger_delivered_not_failed CHECK (
    delivered_at IS NULL OR failed_at IS NULL
),
ADD CONSTRAINT ledger_delivered_by CHECK (
    (delivered_at IS NULL) = (delivered_by IS NULL)
),
ADD CONSTRAINT ledger_batch_started CHECK (
    (batch_id IS NULL) = (batch_started_at IS NULL)
),
ADD CONSTRAINT ledger_batch_delivered CHECK (
    batch_id IS NULL OR delivered_at IS NOT NULL
),
ADD CONSTRAINT ledger_delivery_attempts CHECK (delivery_attempts >= 0),
ADD CONSTRAINT ledger_acked_locally_delivered CHECK (
    NOT acked_locally OR delivered_at IS NOT NULL
),
ADD CONSTRAINT ledger_local_ack_call CHECK (
    local_ack_call_id IS NULL OR acked_locally
);
DROP FUNCTION _ledger_events_rules(
    text, text, text, bigint, timestamptz, text, timestamptz, uuid, timestamptz,
    integer, boolean, uuid
);
-- ==== end: row rules of ledger_events ======================================

-- ==== ledger lease watermark ===============================================
-- Leases move back from the lane rows to the event rows: every event inside
-- its lane's lease becomes state 'leased' with that lease's owner, expiry
-- and call; every undelivered event of a lane's frozen batch carries the
-- batch again. The code is dropped before this runs (the `ledger` view with
-- it), and 0007's is installed after.
ALTER TABLE ledger_events RENAME TO ledger;
ALTER INDEX ledger_events_pkey RENAME TO ledger_pkey;
ALTER SEQUENCE ledger_events_event_id_seq RENAME TO ledger_event_id_seq;
ALTER TABLE ledger RENAME CONSTRAINT ledger_events_run_id_fkey TO ledger_run_id_fkey;
-- Back to PostgreSQL 18's names for a table called ledger (see upgrade.sql).
DO $rename$
DECLARE
    v_name text;
BEGIN
    FOR v_name IN
        SELECT c.conname FROM pg_catalog.pg_constraint AS c
        WHERE c.conrelid = 'ledger'::regclass AND c.contype = 'n' AND c.conname LIKE 'ledger\_events\_%\_not\_null'
    LOOP
        EXECUTE format('ALTER TABLE ledger RENAME CONSTRAINT %I TO %I', v_name, 'ledger_' || substr(v_name, 15));
    END LOOP;
END
$rename$;

DROP INDEX ledger_lane_seq_idx;
DROP INDEX ledger_created_idx;
DROP INDEX ledger_local_ack_call_idx;

ALTER TABLE ledger
DROP CONSTRAINT ledger_delivered_not_failed,
DROP CONSTRAINT ledger_delivered_by,
DROP CONSTRAINT ledger_batch_delivered,
DROP CONSTRAINT ledger_acked_locally_delivered,
DROP CONSTRAINT ledger_local_ack_call,
DROP COLUMN local_ack_call_id,
ADD COLUMN state text NOT NULL DEFAULT 'pending',
ADD COLUMN lease_owner text,
ADD COLUMN lease_expires_at timestamptz;

UPDATE ledger AS l
SET state = CASE WHEN l.delivered_at IS NOT NULL THEN 'delivered' ELSE 'failed' END
WHERE l.delivered_at IS NOT NULL OR l.failed_at IS NOT NULL;

UPDATE ledger AS l
SET
    state = 'leased',
    lease_owner = ll.lease_owner,
    lease_expires_at = ll.lease_expires_at,
    call_id = ll.lease_call_id
FROM ledger_lanes AS ll
WHERE
    l.run_id = ll.run_id AND l.lane = ll.lane
    AND l.state = 'pending' AND l.seq <= ll.leased_through;

UPDATE ledger AS l
SET batch_id = ll.batch_id, batch_started_at = ll.batch_started_at
FROM ledger_lanes AS ll
WHERE
    l.run_id = ll.run_id AND l.lane = ll.lane
    AND l.state <> 'delivered' AND l.seq <= ll.batch_through;

ALTER TABLE ledger
ADD CONSTRAINT ledger_state CHECK (
    state IN ('pending', 'leased', 'delivered', 'failed')
),
ADD CONSTRAINT ledger_leased_has_owner CHECK (
    (state = 'leased')
    = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
),
ADD CONSTRAINT ledger_delivered_iff_at CHECK (
    (state = 'delivered') = (delivered_at IS NOT NULL)
),
ADD CONSTRAINT ledger_failed_iff_at CHECK (
    (state = 'failed') = (failed_at IS NOT NULL)
),
ADD CONSTRAINT ledger_acked_locally_delivered CHECK (
    NOT acked_locally OR state = 'delivered'
);

CREATE INDEX ledger_pending_idx ON ledger (run_id, lane, seq)
WHERE state <> 'delivered';

CREATE INDEX ledger_delivered_idx ON ledger (delivered_at)
WHERE state = 'delivered';

CREATE INDEX ledger_call_id_idx ON ledger (call_id)
WHERE call_id IS NOT NULL;

DROP INDEX ledger_lanes_lease_call_idx;

ALTER TABLE ledger_lanes
DROP CONSTRAINT ledger_lanes_lease,
DROP CONSTRAINT ledger_lanes_batch,
DROP COLUMN delivered_below,
DROP COLUMN lease_owner,
DROP COLUMN lease_expires_at,
DROP COLUMN leased_through,
DROP COLUMN lease_call_id,
DROP COLUMN batch_id,
DROP COLUMN batch_started_at,
DROP COLUMN batch_through;
-- ==== end: ledger lease watermark ==========================================

-- ==== row rules of runs and attempts =======================================
-- Revision 0008, the row rules of runs and attempts: back to one CHECK
-- constraint per rule, exactly as 0007 declared them. Rows written under 0008
-- passed the same rules, so the constraints are added valid.
ALTER TABLE runs
DROP CONSTRAINT runs_rules,
ADD CONSTRAINT runs_run_id_length CHECK (length(run_id) BETWEEN 1 AND 200),
ADD CONSTRAINT runs_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
ADD CONSTRAINT runs_status CHECK (
    status IN (
        'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
    )
),
ADD CONSTRAINT runs_finished_iff_terminal CHECK (
    (status IN ('completed', 'failed', 'cancelled'))
    = (finished_at IS NOT NULL)
),
ADD CONSTRAINT runs_wait_iff_waiting CHECK (
    (status = 'waiting') = (wait IS NOT NULL)
),
ADD CONSTRAINT runs_wake_at_only_waiting CHECK (
    wake_at IS NULL OR status = 'waiting'
),
ADD CONSTRAINT runs_payload_retention CHECK (
    payload_retention IN ('keep', 'drop_on_delivery')
),
ADD CONSTRAINT runs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
ADD CONSTRAINT runs_attempt_count CHECK (attempt_count >= 0),
ADD CONSTRAINT runs_started_has_attempt CHECK (
    status NOT IN ('running', 'waiting') OR attempt_count >= 1
),
ADD CONSTRAINT runs_key_position_iff_key CHECK (
    (concurrency_key IS NULL) = (key_position IS NULL)
),
ADD CONSTRAINT runs_key_held_only_queued CHECK (
    NOT key_held OR (concurrency_key IS NOT NULL AND status = 'queued')
),
ADD CONSTRAINT runs_completed_has_result CHECK (
    status <> 'completed' OR result IS NOT NULL
),
ADD CONSTRAINT runs_ledger_seq CHECK (ledger_seq >= 0);

ALTER TABLE attempts
DROP CONSTRAINT attempts_rules,
ADD CONSTRAINT attempts_attempt CHECK (attempt >= 1),
ADD CONSTRAINT attempts_status CHECK (
    status IN (
        'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
        'resumed', 'released'
    )
),
ADD CONSTRAINT attempts_running_has_lease CHECK (
    status <> 'running' OR lease_expires_at IS NOT NULL
),
ADD CONSTRAINT attempts_finished_iff_ended CHECK (
    (
        status IN (
            'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
        )
    )
    = (finished_at IS NOT NULL)
),
ADD CONSTRAINT attempts_waiting_has_wait CHECK (
    status <> 'waiting' OR wait IS NOT NULL
),
ADD CONSTRAINT attempts_received_has_result CHECK (
    runner_result_received_at IS NULL OR runner_result IS NOT NULL
),
-- What a fenced write that ended the live phase answered (SPEC §3.2):
-- complete, fail / reap (retry_scheduled, failed), cancellation,
-- suspend (waiting, or resumed when a stored signal woke it at once)
-- and release_attempt.
ADD CONSTRAINT attempts_outcome CHECK (
    outcome IN (
        'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
        'resumed', 'released'
    )
),
ADD CONSTRAINT attempts_outcome_op CHECK ((outcome IS NULL) = (outcome_op IS NULL));

DROP FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint
);
DROP FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
);
-- ==== end: row rules of runs and attempts ==================================
