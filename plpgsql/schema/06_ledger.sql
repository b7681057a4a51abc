-- The run ledger's events: per-run, per-lane ordered events awaiting delivery.
-- Readers see them through the `ledger` view (views/ledger.sql), which adds
-- each event's state and lease from its lane and its delivery from
-- ledger_deliveries; the table itself holds what neither a relay's lease nor
-- its acknowledgement changes.
--
-- seq comes from runs.ledger_seq, advanced under the run's row lock, so per
-- run it follows commit order. Within one run event_id order equals seq order
-- for the same reason.
--
-- A lease is not written here: the lease of a lane's claimed events lives on
-- the lane row (ledger_lanes.lease_owner .. leased_through), so leasing a
-- batch is one update of one lane row. Nor is a relay's delivery: an
-- acknowledgement is always of an unbroken prefix of the lane's pending
-- tail, so it is recorded once for the whole prefix, as one row of
-- ledger_deliveries (below) naming its seq range, and the lane's head moves
-- past it. Which events are undelivered is known from the lane (its head,
-- or delivered_below), never from an index predicate: a lane's delivered
-- events are exactly those below its head.
--
-- The delivery columns here (delivered_at, delivered_by, call_id, batch_id,
-- batch_started_at) are written only for an event delivered on its own:
-- a transport-only event a claim acknowledges locally, an event an operator
-- skipped, or one delivered before relay deliveries were recorded by range.
-- A reader takes an event's delivery from the `ledger` view, which looks in
-- both places.
--
-- call_id: the call that acknowledged the event locally; local_ack_call_id:
-- the same, indexed for claim_ledger's replays.
--
-- Rows are written once and rarely updated after: a failed delivery (the
-- head's delivery_attempts, last_error, failed_at, next_attempt_at), a local
-- acknowledgement, a skip, a drop_on_delivery run's payloads. So the heap is
-- packed full (the default fillfactor): relays read batches of events from
-- as few pages as they can.
--
-- run_id has no foreign key, here or on the other ledger tables: every
-- event is written by a call that holds its run's row lock or has just
-- inserted the run (runs.ledger_seq gives the seq), so an event of no run
-- cannot be written, and the key's check cost more than any other part of
-- an enqueue (a KEY SHARE lock per row, two per new run). Deleting or
-- truncating runs takes their ledger rows with them by trigger
-- (08_run_history.sql), as ON DELETE CASCADE did.
-- _ledger_events_rules(): the row rules of a ledger event, called by the
-- ledger_events_rules CHECK below. Built as _runs_rules (02_runs.sql) is,
-- for the same reason (PostgreSQL 15 rebuilds every CHECK expression of a
-- table for each statement that writes it, and every lifecycle event is a
-- statement): one CASE arm per rule, named as the CHECK constraint it
-- replaces and ordered by name, and a broken rule fails with that
-- constraint's error (23514).
CREATE FUNCTION _ledger_events_rules(
    p_lane text,
    p_type text,
    p_delivery_key text,
    p_seq bigint,
    p_delivered_at timestamptz,
    p_delivered_by text,
    p_failed_at timestamptz,
    p_batch_id uuid,
    p_batch_started_at timestamptz,
    p_delivery_attempts integer,
    p_acked_locally boolean,
    p_local_ack_call_id uuid
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT (NOT p_acked_locally OR p_delivered_at IS NOT NULL)
            THEN 'ledger_acked_locally_delivered'
        WHEN NOT (p_batch_id IS NULL OR p_delivered_at IS NOT NULL)
            THEN 'ledger_batch_delivered'
        WHEN NOT ((p_batch_id IS NULL) = (p_batch_started_at IS NULL))
            THEN 'ledger_batch_started'
        WHEN NOT ((p_delivered_at IS NULL) = (p_delivered_by IS NULL))
            THEN 'ledger_delivered_by'
        WHEN NOT (p_delivered_at IS NULL OR p_failed_at IS NULL)
            THEN 'ledger_delivered_not_failed'
        WHEN NOT (p_delivery_attempts >= 0) THEN 'ledger_delivery_attempts'
        WHEN NOT (length(p_delivery_key) BETWEEN 1 AND 400)
            THEN 'ledger_delivery_key_length'
        WHEN NOT (p_lane IN ('lifecycle', 'observability')) THEN 'ledger_lane'
        WHEN NOT (p_local_ack_call_id IS NULL OR p_acked_locally)
            THEN 'ledger_local_ack_call'
        WHEN NOT (p_seq >= 1) THEN 'ledger_seq_positive'
        WHEN NOT (length(p_type) BETWEEN 1 AND 200) THEN 'ledger_type_length'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "ledger_events" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'ledger_events';
END;
$$;

COMMENT ON FUNCTION _ledger_events_rules(
    text, text, text, bigint, timestamptz, text, timestamptz, uuid, timestamptz,
    integer, boolean, uuid
) IS
'The row rules of ledger_events (the ledger_events_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

CREATE TABLE ledger_events (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL,
    lane text NOT NULL,
    seq bigint NOT NULL,
    type text NOT NULL,
    payload jsonb,
    delivery_key text NOT NULL,
    transport_only boolean NOT NULL DEFAULT FALSE,
    created_at timestamptz NOT NULL,
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
    local_ack_call_id uuid,
    -- An operator ended this failed head without delivering it
    -- (skip_ledger_events): when, why, which role, and the call. A skipped
    -- event is done like a delivered one (delivered_at/delivered_by are set
    -- with it, so the lane's delivered prefix and prune treat it alike); the
    -- ledger view reads its state as skipped.
    skipped_at timestamptz,
    skip_reason text,
    skipped_by text,
    skip_call_id uuid,
    -- Every row rule of an event, one per name; see _ledger_events_rules above.
    CONSTRAINT ledger_events_rules CHECK (
        _ledger_events_rules(
            lane, type, delivery_key, seq, delivered_at, delivered_by, failed_at,
            batch_id, batch_started_at, delivery_attempts, acked_locally,
            local_ack_call_id
        )
    )
) WITH (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);

-- Each run lane's events in order. Not partial: delivery writes nothing
-- here (ledger_deliveries below). Scans of the pending
-- tail start at the lane's head (ledger_lanes.head_seq, or delivered_below
-- for an empty lane), so heads and prefixes are seeks, O(batch), whatever
-- the delivered history.
CREATE INDEX ledger_lane_seq_idx ON ledger_events (run_id, lane, seq);

-- Delivery keys are unique. A default key, <run_id>:<seq>, is unique by
-- construction: seq is unique per run (runs.ledger_seq, advanced by an update
-- of the run row), the key's last colon splits it back into run and seq, and
-- an explicit key never ends in a colon and digits (_normalize_events refuses
-- that form). So only the keys a producer chose need an index, and an event
-- with its default key, as every event the engine writes has, writes three
-- index entries, not four (bench/notes.md, "Where a job's WAL goes").
-- A lookup by an explicit key repeats the predicate, which lets it use this
-- index (append_events, _normalize_events, _check_keys_unused).
CREATE UNIQUE INDEX ledger_delivery_key_unique ON ledger_events (delivery_key)
WHERE delivery_key <> run_id || ':' || seq::text;

-- prune(): events by age. An event delivered before a cut-off was created
-- before it.
CREATE INDEX ledger_created_idx ON ledger_events (created_at, event_id);

-- Claim replays: the transport-only events a claim call acknowledged locally.
CREATE INDEX ledger_local_ack_call_idx ON ledger_events (local_ack_call_id)
WHERE local_ack_call_id IS NOT NULL;

-- A relay's acknowledgement: one row for the unbroken prefix of a lane's
-- pending tail it delivered (first_seq .. last_seq), however many events it
-- holds. Writing one row here instead of updating each event row is what
-- makes an acknowledgement of 100 events cost about what one costs, and
-- leaves the event rows as they were written.
--
-- delivered_at, delivered_by: when and by which relay; call_id: the
-- ack_ledger call (what its replay looks up). batch_id, batch_started_at:
-- the frozen batch the events up to batch_through were members of (the
-- lane's, when the acknowledgement covered some of it).
--
-- Ranges of one lane never overlap (each acknowledges what lay at the head,
-- and the head moves past it), so the delivery of an event is the first row
-- of its lane whose last_seq is at least the event's seq, when that row's
-- first_seq is at most it: a primary-key seek (the `ledger` view).
-- Rows go with their run (08_run_history.sql) and with their events
-- (prune).
CREATE TABLE ledger_deliveries (
    run_id text NOT NULL,
    lane text NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    delivered_at timestamptz NOT NULL,
    delivered_by text NOT NULL,
    call_id uuid NOT NULL,
    batch_id uuid,
    batch_started_at timestamptz,
    batch_through bigint,
    PRIMARY KEY (run_id, lane, last_seq),
    CONSTRAINT ledger_deliveries_range CHECK (first_seq >= 1 AND first_seq <= last_seq),
    CONSTRAINT ledger_deliveries_batch CHECK (
        (batch_id IS NULL) = (batch_started_at IS NULL)
        AND (batch_id IS NULL) = (batch_through IS NULL)
    ),
    CONSTRAINT ledger_deliveries_lane CHECK (lane IN ('lifecycle', 'observability'))
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- list_processes() (the relays seen in the last hour) and prune() (the
-- deliveries whose events are gone) read deliveries by time.
CREATE INDEX ledger_deliveries_delivered_idx ON ledger_deliveries (delivered_at);

-- _ledger_lanes_rules(): the row rules of a lane, called by the
-- ledger_lanes_rules CHECK below. Built as _runs_rules (02_runs.sql) is, for
-- the same reason: PostgreSQL 15 rebuilds every CHECK expression of a table
-- for each statement that writes it, and a lane is written by every enqueue,
-- every claim and acknowledgement of its events; five CHECK constraints cost
-- an enqueue about a tenth of its server time. One CASE arm per rule, named
-- as the CHECK constraint it replaces and ordered by name, and a broken rule
-- fails with that constraint's error (23514).
CREATE FUNCTION _ledger_lanes_rules(
    p_lane text,
    p_head_seq bigint,
    p_available_at timestamptz,
    p_blocked boolean,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_leased_through bigint,
    p_lease_call_id uuid,
    p_batch_id uuid,
    p_batch_started_at timestamptz,
    p_batch_through bigint
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT (p_available_at IS NULL OR p_head_seq IS NOT NULL)
            THEN 'ledger_lanes_available_has_head'
        WHEN NOT (
            (p_batch_id IS NULL) = (p_batch_started_at IS NULL)
            AND (p_batch_id IS NULL) = (p_batch_through IS NULL)
        ) THEN 'ledger_lanes_batch'
        WHEN NOT (NOT p_blocked OR p_available_at IS NULL)
            THEN 'ledger_lanes_blocked_not_available'
        WHEN NOT (p_lane IN ('lifecycle', 'observability')) THEN 'ledger_lanes_lane'
        WHEN NOT (
            (p_lease_owner IS NULL) = (p_lease_expires_at IS NULL)
            AND (p_lease_owner IS NULL) = (p_leased_through IS NULL)
            AND (p_lease_call_id IS NULL OR p_lease_owner IS NOT NULL)
        ) THEN 'ledger_lanes_lease'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "ledger_lanes" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'ledger_lanes';
END;
$$;

COMMENT ON FUNCTION _ledger_lanes_rules(
    text, bigint, timestamptz, boolean, text, timestamptz, bigint, uuid, uuid,
    timestamptz, bigint
) IS
'The row rules of ledger_lanes (the ledger_lanes_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

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
--
-- delivered_below: every event of the lane with a lower seq is delivered
-- (the head's seq while there is one); where a scan of an empty lane starts.
--
-- The lease (the watermark): lease_owner holds the lane's events from the
-- head through leased_through until lease_expires_at, taken by the call
-- lease_call_id. An event inside it reads as leased in the ledger view.
-- A lapsed lease stays until someone takes it over, as it did on the events.
-- The frozen batch: the lane's undelivered events from the head through
-- batch_through are the members of batch_id, fixed at its first claim;
-- a re-claim of the head leases exactly them, never more. Both end when
-- the head passes their last seq (_refresh_lane).
CREATE TABLE ledger_lanes (
    run_id text NOT NULL,
    lane text NOT NULL,
    head_seq bigint,
    available_at timestamptz,
    blocked boolean NOT NULL DEFAULT FALSE,
    delivered_below bigint NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    leased_through bigint,
    lease_call_id uuid,
    batch_id uuid,
    batch_started_at timestamptz,
    batch_through bigint,
    PRIMARY KEY (run_id, lane),
    -- Every row rule of a lane, one per name; see _ledger_lanes_rules above.
    CONSTRAINT ledger_lanes_rules CHECK (
        _ledger_lanes_rules(
            lane, head_seq, available_at, blocked, lease_owner, lease_expires_at,
            leased_through, lease_call_id, batch_id, batch_started_at, batch_through
        )
    )
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE INDEX ledger_lanes_available_idx ON ledger_lanes (lane, available_at)
WHERE available_at IS NOT NULL;

-- Claim replays: the lease a claim call took.
CREATE INDEX ledger_lanes_lease_call_idx ON ledger_lanes (lease_call_id)
WHERE lease_call_id IS NOT NULL;

-- list_processes(): the relays holding lanes now, and whether a lease they
-- hold has lapsed. Partial: only leased lanes have an entry. A claim or a
-- renewal writes one, in an update that is already not HOT (it changes
-- available_at, a column of ledger_lanes_available_idx).
CREATE INDEX ledger_lanes_lease_owner_idx ON ledger_lanes (lease_owner)
WHERE lease_owner IS NOT NULL;

-- Operators' view of blocked lanes (list_blocked_heads, requeue_blocked_heads;
-- plpgsql/admin/): a lane is blocked behind a failed head, which only an
-- operator's requeue unblocks, so there are few and each stays a while.
-- A lane's other writes (claims, acknowledgements, leases) never change
-- blocked and find no entry to add: they cost nothing here.
CREATE INDEX ledger_lanes_blocked_idx ON ledger_lanes (run_id, lane)
WHERE blocked;

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
    run_id text NOT NULL,
    lane text NOT NULL,
    first_seq bigint NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, lane),
    CONSTRAINT ledger_wakeups_lane CHECK (lane IN ('lifecycle', 'observability'))
);

-- Discovery and ledger_next_due_at take the oldest wake-up of a lane.
CREATE INDEX ledger_wakeups_lane_idx ON ledger_wakeups (lane, created_at);
