-- Paused queues (pause_queue, resume_queue; plpgsql/admin/): claims take no
-- run of a queue listed here. Empty unless an operator paused a queue: every
-- claim looks at this table once (_claim), and while it is empty that look
-- costs a scan of no page (about a microsecond, measured; one buffer while
-- a resumed queue's dead row is left, which autovacuum removes at its next
-- round, truncating the table back to no page: any dead row triggers it).
-- paused_by: the operator, as the caller named them.
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
