-- Installation-wide settings: one row, written by the schema owner only.
--
-- allow_clock_override gates runrelay._now()'s test clock. It lives in a table
-- rather than a GUC because any role may SET a custom GUC: a worker that could
-- move the clock forward could reap other workers' leases early.
CREATE TABLE settings (
    singleton boolean PRIMARY KEY DEFAULT TRUE,
    max_payload_bytes integer NOT NULL DEFAULT 1048576,
    ledger_max_delivery_attempts integer NOT NULL DEFAULT 10,
    retry_base_seconds double precision NOT NULL DEFAULT 1,
    retry_max_seconds double precision NOT NULL DEFAULT 3600,
    allow_clock_override boolean NOT NULL DEFAULT FALSE,
    -- record_step appends a step.recorded event to the run's observability
    -- lane for each step it records; false: none.
    step_events boolean NOT NULL DEFAULT TRUE,
    -- The kinds of notification the install sends (_notifying,
    -- _internal/channels.sql): runs, ledger, terminal, delivered, cancel.
    notifications text[] NOT NULL DEFAULT ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel'],
    CONSTRAINT settings_singleton CHECK (singleton),
    CONSTRAINT settings_max_payload_bytes CHECK (
        max_payload_bytes BETWEEN 1024 AND 268435456
    ),
    CONSTRAINT settings_ledger_max_delivery_attempts CHECK (
        ledger_max_delivery_attempts BETWEEN 1 AND 1000
    ),
    CONSTRAINT settings_retry_seconds CHECK (
        retry_base_seconds > 0 AND retry_max_seconds >= retry_base_seconds
    ),
    -- Only the five kinds (a null element is in no array, so it fails too).
    CONSTRAINT settings_notifications CHECK (
        notifications <@ ARRAY['runs', 'ledger', 'terminal', 'delivered', 'cancel']
    )
);

INSERT INTO settings DEFAULT VALUES;
