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
    -- A transport-only head acknowledged by a claim rather than delivered;
    -- kept apart so that a replayed claim can report it again.
    acked_locally boolean NOT NULL DEFAULT FALSE,
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
    CONSTRAINT ledger_delivery_attempts CHECK (delivery_attempts >= 0),
    CONSTRAINT ledger_acked_locally_delivered CHECK (
        NOT acked_locally OR state = 'delivered'
    )
) WITH (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);

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
-- never per event) and lock the lane row, not the run row; appenders lock a
-- lane row only to change it, never waiting (custody.sql), so delivery does
-- not wait for the run's workers or producers.
--
-- available_at: null when the lane has nothing pending or its head failed
-- (blocked); otherwise the moment its head becomes claimable (its creation,
-- its retry time, or the expiry of its lease), or, for a lane a relay drained
-- while a writer held the run row, the moment to look at it again
-- (_refresh_lane).
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
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE INDEX ledger_lanes_available_idx ON ledger_lanes (lane, available_at)
WHERE available_at IS NOT NULL;

-- Lane wake-ups an appender could not write on the lane row. An append that
-- finds a lane empty wakes it (head_seq, available_at), but never waits for
-- a lane row: when a relay holds it at that moment, the append records the
-- wake-up here instead (first_seq: the first event it appended to the lane),
-- and the next lane-lock holder that reads the lane's tail -- a claim, an
-- acknowledgement, any refresh -- consumes the row and starts its scan no later
-- than first_seq. So an event is never stranded behind an empty lane, whatever
-- the relay that held the lane did next (committed, rolled back, or never
-- looked at the lane again). Rows are rare and short-lived: discovery takes
-- them first and ledger_next_due_at reports them as due.
CREATE TABLE ledger_wakeups (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lane text NOT NULL,
    first_seq bigint NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, lane),
    CONSTRAINT ledger_wakeups_lane CHECK (lane IN ('lifecycle', 'observability'))
);

-- Discovery and ledger_next_due_at take the oldest wake-up of a lane.
CREATE INDEX ledger_wakeups_lane_idx ON ledger_wakeups (lane, created_at);
