-- A run: a durable unit of work named by the caller.
--
-- Custody: every writer locks the run row first (after the run's concurrency
-- key, when it has one), then its attempt rows in attempt order.
--
-- Concurrency keys: runs sharing a key are strictly serial. Among the live
-- (queued, running, waiting) runs of a key, only the one with the smallest
-- key_position is not key_held; every other one is held out of the claim
-- indexes. The invariant is maintained under the key's row lock
-- (concurrency_keys, schema/12_locks.sql), which enqueue and every terminal
-- transition take.
CREATE SEQUENCE runs_key_position_seq AS bigint;

-- _runs_rules(): the row rules of a run, the table's last line of defence
-- behind the functions that write it. The runs_rules CHECK below calls it with
-- the columns the rules read; each rule keeps its own name, and a row that
-- breaks one fails with the error a CHECK constraint of that name raises:
-- SQLSTATE 23514 (check_violation), `new row for relation "runs" violates
-- check constraint "runs_status"`, the rule's name in the error's constraint
-- field. When a row breaks several rules, the first by name is reported, as
-- PostgreSQL does for separate CHECK constraints (it checks them by name).
--
-- Why one function instead of fourteen CHECK constraints: PostgreSQL 15
-- rebuilds every CHECK expression of a table for each statement that writes
-- it (it parses the stored node text, plans and compiles the expression), so
-- fourteen expressions cost far more than the rows they check. This
-- constraint's expression is one call; PL/pgSQL plans the rules once per
-- session and compiles them once per transaction. The CASE arm for a rule
-- holds NOT of what the rule's CHECK held, so a NULL passes as in a CHECK.
--
-- State, not code: a table constraint depends on it, so the migrations'
-- drop_code keeps it (support.py) and it changes only by a revision's
-- upgrade.sql/downgrade.sql, like the table. IMMUTABLE and deterministic
-- (it reads its arguments only). grants.sql revokes EXECUTE from PUBLIC as
-- for every function; only the owner writes runs, through the schema's
-- functions.
--
-- The rules functions are the only functions whose search_path is not
-- pinned. A SET clause saves and restores the setting on every call, and a
-- CHECK calls its function for every row written: an acknowledgement of 100
-- events spent a tenth of its server time on it (837 -> 752 us), a bulk
-- enqueue of 100 runs 7 %. Nothing a path can hold changes what these
-- functions do: they read no table and call no function of the schema, only
-- pg_catalog's operators and length(), and pg_catalog is searched first in
-- any path that does not name it; and they run only inside writes to their
-- tables, which only the owner makes, through the schema's functions, whose
-- own path is pinned (tests/python/test_security.py holds all of this).
CREATE FUNCTION _runs_rules(
    p_run_id text,
    p_queue text,
    p_status text,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_wake_at timestamptz,
    p_payload_retention text,
    p_max_attempts integer,
    p_attempt_count integer,
    p_concurrency_key text,
    p_key_position bigint,
    p_key_held boolean,
    p_result jsonb,
    p_ledger_seq bigint,
    p_series_start integer
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
        WHEN NOT (p_attempt_count >= 0) THEN 'runs_attempt_count'
        WHEN NOT (p_status <> 'completed' OR p_result IS NOT NULL)
            THEN 'runs_completed_has_result'
        WHEN NOT (
            (p_status IN ('completed', 'failed', 'cancelled'))
            = (p_finished_at IS NOT NULL)
        ) THEN 'runs_finished_iff_terminal'
        WHEN NOT (
            NOT p_key_held OR (p_concurrency_key IS NOT NULL AND p_status = 'queued')
        ) THEN 'runs_key_held_only_queued'
        WHEN NOT ((p_concurrency_key IS NULL) = (p_key_position IS NULL))
            THEN 'runs_key_position_iff_key'
        WHEN NOT (p_ledger_seq >= 0) THEN 'runs_ledger_seq'
        WHEN NOT (p_max_attempts BETWEEN 1 AND 1000) THEN 'runs_max_attempts'
        WHEN NOT (p_payload_retention IN ('keep', 'drop_on_delivery'))
            THEN 'runs_payload_retention'
        WHEN NOT (length(p_queue) BETWEEN 1 AND 200) THEN 'runs_queue_length'
        WHEN NOT (length(p_run_id) BETWEEN 1 AND 200) THEN 'runs_run_id_length'
        WHEN NOT (p_series_start BETWEEN 0 AND p_attempt_count) THEN 'runs_series_start'
        WHEN NOT (p_status NOT IN ('running', 'waiting') OR p_attempt_count >= 1)
            THEN 'runs_started_has_attempt'
        WHEN NOT (
            p_status IN (
                'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
            )
        ) THEN 'runs_status'
        WHEN NOT ((p_status = 'waiting') = (p_wait IS NOT NULL))
            THEN 'runs_wait_iff_waiting'
        WHEN NOT (p_wake_at IS NULL OR p_status = 'waiting')
            THEN 'runs_wake_at_only_waiting'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'runs';
END;
$$;

COMMENT ON FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint, integer
) IS
'The row rules of runs (the runs_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

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
    -- The current attempt series is the attempts numbered above
    -- series_start: only their failures count against max_attempts
    -- (_retry_decision). 0 until retry_run starts a new series for an
    -- ended run, at its last attempt.
    series_start integer NOT NULL DEFAULT 0,
    -- The W3C trace context the producer's tracing gave the run at enqueue
    -- ({"traceparent", "tracestate"?}, _internal/trace_context.sql), read by
    -- the workers and relays of a tracing client (run_trace_context); null
    -- when the producer traced nothing. Written once, at the insert.
    trace_context jsonb,
    -- Why the run was cancelled (cancel_run's reason), once a cancellation
    -- ended it: the marker that carried the reason is gone by then, and an
    -- operator reading the run asks why. Cleared when retry_run revives it.
    cancel_reason text,
    -- The named task that handles the run (enqueue_run's task; null: an
    -- untyped run, any worker's handler takes it). A claim's `tasks` filter
    -- takes only runs of those tasks, through runs_claim_task_idx.
    task text,
    -- Every row rule of a run, one per name; see _runs_rules above.
    CONSTRAINT runs_rules CHECK (
        _runs_rules(
            run_id, queue, status, finished_at, wait, wake_at, payload_retention,
            max_attempts, attempt_count, concurrency_key, key_position, key_held,
            result, ledger_seq, series_start
        )
    )
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- Claim paths: the runnable backlog, best first, for one queue or for all.
-- The predicate is the runnable rule (_runnable, _internal/runnable.sql)
-- without its time condition, spelled out because an index cannot depend on
-- a function the migrations drop and recreate; the claim queries call
-- _runnable, which the planner inlines and matches to these predicates.
-- tests/python/test_rule_homes.py proves the two agree.
CREATE INDEX runs_claim_queue_idx ON runs (queue, priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held;

CREATE INDEX runs_claim_any_idx ON runs (priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held;

-- The runnable backlog of each (task, queue), best first: a claim with a
-- tasks filter reads one range per (queue, task) pair and merges them, so
-- runs of other tasks waiting in the same queue cost it nothing. Untyped
-- runs (task null) are not in it and pay nothing for it.
CREATE INDEX runs_claim_task_idx ON runs (task, queue, priority DESC, run_at)
WHERE status = 'queued' AND NOT key_held AND task IS NOT NULL;

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

-- Operators' listings (list_runs, purge_runs; plpgsql/admin/): every run but
-- the running ones, newest first within each (queue, status), and the same
-- per concurrency key. Running runs are left out so that a claim, which
-- turns a queued run into a running one on every job, adds no entry here
-- (a partial index gets an entry only for a row version that matches its
-- predicate); list_runs reads the running runs through their running
-- attempts (attempts_lease_expiry_idx) instead, O(runs in flight). The
-- other writes of runs add one entry to each (the second only for keyed
-- runs): an enqueue, a completion, a failure, a suspension, a wake. Their
-- columns never change once written (status aside, which every such write
-- changes and the claim indexes' predicates already name), so updates that
-- were HOT stay HOT.
CREATE INDEX runs_list_idx ON runs (queue, status, created_at, run_id) INCLUDE (finished_at)
WHERE status <> 'running';

CREATE INDEX runs_key_list_idx ON runs (concurrency_key, created_at, run_id)
WHERE concurrency_key IS NOT NULL AND status <> 'running';
