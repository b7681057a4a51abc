-- Undo revision 0005.
-- Revision 0004 has no released status. A released attempt becomes resumed:
-- the one 0004 status with the same meaning (the attempt ended without
-- failing and its run was queued again), so every row stays valid under
-- 0004's CHECKs, and the run keeps its failure budget (0004 counts failed
-- and lost attempts only). outcome and outcome_op are kept: after an upgrade
-- back to 0005 a replayed release_attempt still answers released.
UPDATE attempts SET status = 'resumed'
WHERE status = 'released';

ALTER TABLE attempts DROP CONSTRAINT attempts_finished_iff_ended;

ALTER TABLE attempts ADD CONSTRAINT attempts_finished_iff_ended CHECK (
    (status IN ('completed', 'failed', 'cancelled', 'lost', 'resumed'))
    = (finished_at IS NOT NULL)
);

ALTER TABLE attempts DROP CONSTRAINT attempts_status;

ALTER TABLE attempts ADD CONSTRAINT attempts_status CHECK (
    status IN (
        'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
        'resumed'
    )
);
