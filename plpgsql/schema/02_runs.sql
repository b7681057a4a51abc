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
