-- Revision 0007: attempts.outcome takes only the outcomes the engine writes.
-- Every earlier revision wrote only these values (completed, retry_scheduled,
-- failed, cancelled, waiting, resumed, released) or NULL, so the check holds
-- for every existing row and is added valid at once (one scan of attempts,
-- inside the migration's transaction).
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome CHECK (
    outcome IN (
        'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
        'resumed', 'released'
    )
);
