-- Frozen DDL of revision 0001 (the whole initial schema).

-- >>> plpgsql/schema/01_settings.sql
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
    CONSTRAINT settings_singleton CHECK (singleton),
    CONSTRAINT settings_max_payload_bytes CHECK (
        max_payload_bytes BETWEEN 1024 AND 268435456
    ),
    CONSTRAINT settings_ledger_max_delivery_attempts CHECK (
        ledger_max_delivery_attempts BETWEEN 1 AND 1000
    ),
    CONSTRAINT settings_retry_seconds CHECK (
        retry_base_seconds > 0 AND retry_max_seconds >= retry_base_seconds
    )
);

INSERT INTO settings DEFAULT VALUES;

-- >>> plpgsql/schema/02_runs.sql
-- A run: a durable unit of work named by the caller.
--
-- Custody: every writer locks the run row first (after the run's concurrency
-- key, when it has one), then its attempt rows in attempt order.
--
-- Concurrency keys: runs sharing a key are strictly serial. Among the live
-- (queued, running, waiting) runs of a key, only the one with the smallest
-- key_position is not key_held; every other one is held out of the claim
-- indexes. The invariant is maintained under the key's advisory lock, which
-- enqueue and every terminal transition take.
CREATE SEQUENCE runs_key_position_seq AS bigint;

CREATE TABLE runs (
    run_id text PRIMARY KEY,
    queue text NOT NULL,
    status text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    concurrency_key text,
    key_position bigint,
    key_held boolean NOT NULL DEFAULT FALSE,
    payload jsonb NOT NULL,
    run_at timestamptz NOT NULL,
    max_attempts integer NOT NULL,
    attempt_count integer NOT NULL DEFAULT 0,
    wait jsonb,
    wake_at timestamptz,
    resume jsonb,
    result jsonb,
    error jsonb,
    payload_retention text NOT NULL DEFAULT 'keep',
    ledger_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    finished_at timestamptz,
    CONSTRAINT runs_run_id_length CHECK (length(run_id) BETWEEN 1 AND 200),
    CONSTRAINT runs_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT runs_status CHECK (
        status IN (
            'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
        )
    ),
    CONSTRAINT runs_finished_iff_terminal CHECK (
        (status IN ('completed', 'failed', 'cancelled'))
        = (finished_at IS NOT NULL)
    ),
    CONSTRAINT runs_wait_iff_waiting CHECK (
        (status = 'waiting') = (wait IS NOT NULL)
    ),
    CONSTRAINT runs_wake_at_only_waiting CHECK (
        wake_at IS NULL OR status = 'waiting'
    ),
    CONSTRAINT runs_payload_retention CHECK (
        payload_retention IN ('keep', 'drop_on_delivery')
    ),
    CONSTRAINT runs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT runs_attempt_count CHECK (attempt_count >= 0),
    CONSTRAINT runs_started_has_attempt CHECK (
        status NOT IN ('running', 'waiting') OR attempt_count >= 1
    ),
    CONSTRAINT runs_key_position_iff_key CHECK (
        (concurrency_key IS NULL) = (key_position IS NULL)
    ),
    CONSTRAINT runs_key_held_only_queued CHECK (
        NOT key_held OR (concurrency_key IS NOT NULL AND status = 'queued')
    ),
    CONSTRAINT runs_completed_has_result CHECK (
        status <> 'completed' OR result IS NOT NULL
    ),
    CONSTRAINT runs_ledger_seq CHECK (ledger_seq >= 0)
) WITH (fillfactor = 80);

-- Claim paths: the runnable backlog, best first, for one queue or for all.
CREATE INDEX runs_claim_queue_idx ON runs (queue, priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held;

CREATE INDEX runs_claim_any_idx ON runs (priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held;

-- Waits that end by themselves (a due sleep, a timeout), woken by claims.
CREATE INDEX runs_wake_idx ON runs (queue, wake_at)
WHERE wake_at IS NOT NULL;

CREATE INDEX runs_wake_any_idx ON runs (wake_at)
WHERE wake_at IS NOT NULL;

-- The live runs of a concurrency key, in enqueue order: its head is first.
CREATE INDEX runs_key_live_idx ON runs (concurrency_key, key_position)
WHERE
concurrency_key IS NOT NULL
AND status IN ('queued', 'running', 'waiting');

-- >>> plpgsql/schema/03_attempts.sql
-- An attempt: one execution of a run, fenced by its lease token.
--
-- outcome/outcome_op record what the write that ended the attempt's live
-- phase answered, so that the same call repeated after a lost reply answers
-- the same (SPEC: "Replays are exact"). call_id remembers the claim call that
-- opened the attempt, for claim replays.
CREATE TABLE attempts (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    worker text NOT NULL,
    lease_token uuid NOT NULL,
    status text NOT NULL,
    claimed_at timestamptz NOT NULL,
    heartbeat_at timestamptz,
    lease_expires_at timestamptz,
    runner_result jsonb,
    runner_result_received_at timestamptz,
    error jsonb,
    finished_at timestamptz,
    call_id uuid,
    wait jsonb,
    outcome text,
    outcome_op text,
    PRIMARY KEY (run_id, attempt),
    CONSTRAINT attempts_attempt CHECK (attempt >= 1),
    CONSTRAINT attempts_status CHECK (
        status IN (
            'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
            'resumed'
        )
    ),
    CONSTRAINT attempts_running_has_lease CHECK (
        status <> 'running' OR lease_expires_at IS NOT NULL
    ),
    CONSTRAINT attempts_finished_iff_ended CHECK (
        (status IN ('completed', 'failed', 'cancelled', 'lost', 'resumed'))
        = (finished_at IS NOT NULL)
    ),
    CONSTRAINT attempts_waiting_has_wait CHECK (
        status <> 'waiting' OR wait IS NOT NULL
    ),
    CONSTRAINT attempts_received_has_result CHECK (
        runner_result_received_at IS NULL OR runner_result IS NOT NULL
    ),
    CONSTRAINT attempts_outcome_op CHECK ((outcome IS NULL) = (outcome_op IS NULL))
);

-- The reaper's path: live leases by expiry.
CREATE INDEX attempts_lease_expiry_idx ON attempts (lease_expires_at)
WHERE status = 'running';

-- Claim replays: the attempts a claim call opened.
CREATE INDEX attempts_call_id_idx ON attempts (call_id)
WHERE call_id IS NOT NULL;

-- >>> plpgsql/schema/04_cancellations.sql
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

-- >>> plpgsql/schema/05_signals.sql
-- Signals sent to runs that were not (yet) waiting for them; the next
-- matching event wait consumes the oldest one.
CREATE TABLE signals (
    signal_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    name text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT signals_name_length CHECK (length(name) BETWEEN 1 AND 200)
);

CREATE INDEX signals_run_name_idx ON signals (run_id, name, signal_id);

-- >>> plpgsql/schema/06_ledger.sql
-- The run ledger: per-run, per-lane ordered events awaiting delivery.
--
-- seq comes from runs.ledger_seq, advanced under the run's row lock, so per
-- run it follows commit order. Within one run event_id order equals seq order
-- for the same reason.
CREATE TABLE ledger (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lane text NOT NULL,
    seq bigint NOT NULL,
    type text NOT NULL,
    payload jsonb,
    delivery_key text NOT NULL,
    transport_only boolean NOT NULL DEFAULT FALSE,
    created_at timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    lease_owner text,
    lease_expires_at timestamptz,
    batch_id uuid,
    batch_started_at timestamptz,
    delivery_attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    failed_at timestamptz,
    last_error jsonb,
    delivered_at timestamptz,
    delivered_by text,
    call_id uuid,
    CONSTRAINT ledger_delivery_key_unique UNIQUE (delivery_key),
    CONSTRAINT ledger_lane CHECK (lane IN ('lifecycle', 'observability')),
    CONSTRAINT ledger_state CHECK (
        state IN ('pending', 'leased', 'delivered', 'failed')
    ),
    CONSTRAINT ledger_type_length CHECK (length(type) BETWEEN 1 AND 200),
    CONSTRAINT ledger_delivery_key_length CHECK (
        length(delivery_key) BETWEEN 1 AND 400
    ),
    CONSTRAINT ledger_seq_positive CHECK (seq >= 1),
    CONSTRAINT ledger_leased_has_owner CHECK (
        (state = 'leased')
        = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
    ),
    CONSTRAINT ledger_delivered_iff_at CHECK (
        (state = 'delivered') = (delivered_at IS NOT NULL)
    ),
    CONSTRAINT ledger_failed_iff_at CHECK (
        (state = 'failed') = (failed_at IS NOT NULL)
    ),
    CONSTRAINT ledger_batch_started CHECK (
        (batch_id IS NULL) = (batch_started_at IS NULL)
    ),
    CONSTRAINT ledger_delivery_attempts CHECK (delivery_attempts >= 0)
) WITH (fillfactor = 90);

-- Each run lane's undelivered tail in order: heads and prefixes are seeks.
CREATE INDEX ledger_pending_idx ON ledger (run_id, lane, seq)
WHERE state <> 'delivered';

-- prune(): delivered events by age.
CREATE INDEX ledger_delivered_idx ON ledger (delivered_at)
WHERE state = 'delivered';

-- Claim replays: what a claim call leased or acknowledged locally.
CREATE INDEX ledger_call_id_idx ON ledger (call_id)
WHERE call_id IS NOT NULL;

-- One row per (run, lane) that has undelivered events: where its head is and
-- when it can next be claimed. Relays discover work here (one row per run,
-- never per event) and lock the lane row, not the run row, so delivery never
-- contends with the run's workers.
--
-- available_at: null when the lane has nothing pending or its head failed
-- (blocked); otherwise the moment its head becomes claimable (its creation,
-- its retry time, or the expiry of its lease).
CREATE TABLE ledger_lanes (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lane text NOT NULL,
    head_seq bigint,
    available_at timestamptz,
    blocked boolean NOT NULL DEFAULT FALSE,
    PRIMARY KEY (run_id, lane),
    CONSTRAINT ledger_lanes_lane CHECK (lane IN ('lifecycle', 'observability')),
    CONSTRAINT ledger_lanes_blocked_not_available CHECK (
        NOT blocked OR available_at IS NULL
    ),
    CONSTRAINT ledger_lanes_available_has_head CHECK (
        available_at IS NULL OR head_seq IS NOT NULL
    )
) WITH (fillfactor = 70);

CREATE INDEX ledger_lanes_available_idx ON ledger_lanes (lane, available_at)
WHERE available_at IS NOT NULL;
