-- Cancel markers. Written without waiting for the run's custody locks (there
-- is deliberately no foreign key: its KEY SHARE check would queue behind a
-- writer's row lock) and re-checked by every writer after it has taken them.
CREATE TABLE cancellations (
    run_id text PRIMARY KEY,
    reason text,
    requested_at timestamptz NOT NULL,
    CONSTRAINT cancellations_reason_length CHECK (
        reason IS NULL OR length(reason) <= 2000
    )
);
