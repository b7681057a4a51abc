-- Result types shared by several functions. They are created before any
-- function (this file sorts first), since a function's return type must exist
-- when the function is created.

-- A ledger append: what append_events returns, and _append.
CREATE TYPE append_result AS (
    event_id bigint,
    seq bigint,
    delivery_key text
);

-- One ledger event as a claim returns it (claim_ledger): kind, the event and
-- its lease. _ledger_row, the one formatting of a ledger event, produces an
-- ack_ledger_result, of which this is the first eleven columns.
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

-- One ledger event as an acknowledgement reports it (ack_ledger, and the
-- local acks of a claim): claim_ledger_result's columns, then lag_ms
-- (delivered_at - created_at) for an acknowledged event. Built from
-- claim_ledger_result so that the two cannot drift: PostgreSQL has no CREATE
-- TYPE ... INHERITS, and a nested type would change the columns a client
-- reads (SPEC 3.3 gives claim_ledger no lag_ms, ack_ledger has it).
DO $ack_type$
BEGIN
    EXECUTE (
        SELECT format(
            'CREATE TYPE ack_ledger_result AS (%s, lag_ms bigint)',
            string_agg(
                format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)),
                ', ' ORDER BY a.attnum
            )
        )
        FROM pg_catalog.pg_attribute AS a
        WHERE
            a.attrelid = 'claim_ledger_result'::regclass
            AND a.attnum > 0
            AND NOT a.attisdropped
    );
END
$ack_type$;

-- One enqueued run: what enqueue_runs returns for each item, and _enqueue
-- (enqueue_run's own enqueue_run_result has the same columns).
CREATE TYPE enqueue_runs_result AS (
    run_id text,
    status text,
    created boolean
);

-- A claimed attempt: what claim_attempts returns, and _claim (in an array).
-- task is the run's task (null: untyped). steps is the run's recorded steps
-- (record_step; step name -> result; null when there are none).
CREATE TYPE claim_attempts_result AS (
    run_id text,
    attempt integer,
    lease_token uuid,
    queue text,
    payload jsonb,
    resume jsonb,
    lease_expires_at timestamptz,
    task text,
    steps jsonb
);
