-- Revision 0005: release_attempt.
-- An attempt handed back by release_attempt ends with status released: ended
-- (finished_at set) but not a failure, so it does not count against the
-- run's max_attempts. Both CHECKs only widen, so no existing row can fail
-- them.
ALTER TABLE attempts DROP CONSTRAINT attempts_status;

ALTER TABLE attempts ADD CONSTRAINT attempts_status CHECK (
    status IN (
        'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
        'resumed', 'released'
    )
);

ALTER TABLE attempts DROP CONSTRAINT attempts_finished_iff_ended;

ALTER TABLE attempts ADD CONSTRAINT attempts_finished_iff_ended CHECK (
    (
        status IN (
            'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
        )
    )
    = (finished_at IS NOT NULL)
);
