-- Result types shared by several functions. They are created before any
-- function (this file sorts first), since a function's return type must exist
-- when the function is created.

-- A ledger append: what append_events returns, and _append.
CREATE TYPE append_result AS (
    event_id bigint,
    seq bigint,
    delivery_key text
);

-- One ledger event as an acknowledgement reports it (ack_ledger): kind, the
-- event, its lease, and lag_ms (delivered_at - created_at) for an
-- acknowledged event. _ledger_row, the one formatting of a ledger event,
-- produces it, and so does _claim_lane, so that the local acks of a claim
-- carry their lag wherever they are reported.
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

-- One ledger event as a claim returns it (claim_ledger): ack_ledger_result
-- without its last column, lag_ms (SPEC 3.3 gives claim_ledger no lag). Two
-- types because PostgreSQL cannot derive one composite type from another
-- (CREATE TYPE has no INHERITS, and a nested type would change the columns a
-- client reads), and claim_ledger's columns are public. 031_claim_ledger.sql
-- checks that these columns stay ack_ledger_result's first eleven.
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
