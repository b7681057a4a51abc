-- A run's recorded steps (record_step): the checkpoints of a durable
-- handler. A step is recorded once per run, by the attempt that held the
-- run then, and stays with the run through retries, waits, wakes, releases
-- and reaping, so a later attempt reads it back (every claim returns the
-- run's steps, _steps_of) instead of doing that work again. Deleted with
-- the run (the foreign key cascades, as the attempts' and signals' do).
--
-- Written only under the run's row lock (record_step takes it), so the
-- KEY SHARE lock the foreign key takes adds no wait, and position (the
-- run's steps numbered in the order they were recorded, from 1) is taken
-- without a race.
CREATE TABLE steps (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step text NOT NULL,
    position integer NOT NULL,
    result jsonb NOT NULL,
    -- The attempt that recorded it: a repeat of that call (same attempt and
    -- token, same result) answers recorded again, exactly.
    attempt integer NOT NULL,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, step),
    CONSTRAINT steps_position_unique UNIQUE (run_id, position),
    CONSTRAINT steps_step_length CHECK (length(step) BETWEEN 1 AND 200),
    CONSTRAINT steps_position_positive CHECK (position >= 1),
    CONSTRAINT steps_attempt_positive CHECK (attempt >= 1)
);
