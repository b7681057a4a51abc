-- Result types shared by several functions. They are created before any
-- function (this file sorts first), since a function's return type must exist
-- when the function is created.

-- A ledger append: what append_events returns, and _append.
CREATE TYPE append_result AS (
    event_id bigint,
    seq bigint,
    delivery_key text
);

-- One ledger event as a claim returns it (claim_ledger).
CREATE TYPE claim_ledger_result AS (
    kind text,
    event_id bigint,
    run_id text,
    seq bigint,
    type text,
    payload jsonb,
    delivery_key text,
    created_at timestamptz,
    frozen boolean,
    lease_expires_at timestamptz,
    lease_remaining_ms bigint
);

-- One ledger event as an acknowledgement reports it (ack_ledger): a claim's
-- row plus lag_ms (delivered_at - created_at) for an acknowledged event.
-- _claim_lane and _ledger_row produce it, so that the local acks of a claim
-- carry their lag wherever they are reported; claim_ledger leaves lag_ms out.
CREATE TYPE ack_ledger_result AS (
    kind text,
    event_id bigint,
    run_id text,
    seq bigint,
    type text,
    payload jsonb,
    delivery_key text,
    created_at timestamptz,
    frozen boolean,
    lease_expires_at timestamptz,
    lease_remaining_ms bigint,
    lag_ms bigint
);
