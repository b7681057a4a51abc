-- Undo revision 0008's table changes. Each change has its own section,
-- delimited by a header and an end line, so that sections written
-- separately merge side by side.

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
