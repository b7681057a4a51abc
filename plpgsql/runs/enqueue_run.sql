-- enqueue_run(): create a run, or return the existing one.
--
-- Idempotent on run_id: the same run_id with the same queue, task and
-- payload returns the existing run with created = false; a different queue,
-- task or payload raises 22023. task names the task that handles the run
-- (1 to 200 characters, the rules of a queue name; null: untyped), which a
-- claim's tasks filter matches. Concurrent enqueues of one run_id resolve through the primary
-- key (ON CONFLICT waits for the other transaction), so exactly one creates.
-- Identifiers follow _id_valid; a run_id starting schedule: raises 22023
-- (reserved for the runs of schedules, _run_id_reserved).
--
-- Trace context: a new run keeps the transaction-local setting
-- runrelay.trace_context, when set, as its trace context
-- (_internal/trace_context.sql; a malformed one raises 22023). A repeat
-- answers the existing run and keeps the context it was created with.
--
-- Locks: for a run with a concurrency key, the key's row lock (custody
-- step 1, _lock_key; the key's first run creates the row) before deciding
-- whether the run is the key's head; no run row lock is needed for a row no
-- one else can see yet. Emits run.queued. Called inside
-- a caller's transaction it commits or rolls back with the caller's writes.
CREATE TYPE enqueue_run_result AS (
    run_id text,
    status text,
    created boolean
);

CREATE FUNCTION enqueue_run(
    run_id text,
    queue text DEFAULT 'default',
    payload jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT now(),
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT 3,
    payload_retention text DEFAULT 'keep',
    concurrency_key text DEFAULT NULL,
    task text DEFAULT NULL
)
RETURNS SETOF enqueue_run_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_now timestamptz;
    v_run_at timestamptz;
    v_existing runs;
    v_held boolean := FALSE;
    v_inserted text;
    v_trace_context jsonb;
    v_created bigint;
    v_laned bigint;
BEGIN
    -- A producer's usual call: a new run without a concurrency key. One
    -- statement checks what the steps below check of it (READ COMMITTED,
    -- _enqueue_valid, the task's name, this shard's ownership of the run_id)
    -- and writes what they write: the run, its run.queued event at seq 1 (as
    -- _emit), and its lifecycle lane with that event at the head, notifying
    -- the relays (as _lanes_on_write does for a lane it creates). A run_id
    -- that exists already (a repeated enqueue) or any argument that fails a
    -- check writes nothing here and takes the steps below, which answer or
    -- name what is wrong.
    IF enqueue_run.concurrency_key IS NULL AND _fast_paths() THEN
        v_now := _now();
        v_run_at := coalesce(enqueue_run.run_at, v_now);
        WITH checked AS (
            SELECT
                current_setting('transaction_isolation') = 'read committed'
                AND _enqueue_valid(
                    enqueue_run.run_id, enqueue_run.queue, enqueue_run.payload, enqueue_run.run_at,
                    enqueue_run.priority, enqueue_run.max_attempts, enqueue_run.payload_retention, NULL,
                    s.max_payload_bytes
                )
                AND (enqueue_run.task IS NULL OR coalesce(_id_valid(enqueue_run.task), FALSE))
                AND NOT EXISTS (
                    SELECT FROM shard_ownership AS o
                    WHERE NOT _routing_partition(enqueue_run.run_id, o.partition_count) = ANY (o.partitions)
                ) AS ok
            FROM settings AS s
        ),
        created AS (
            INSERT INTO runs AS r (
                run_id, queue, status, priority, concurrency_key, key_position, key_held,
                payload, run_at, max_attempts, payload_retention, created_at, updated_at, ledger_seq,
                trace_context, task
            )
            SELECT
                enqueue_run.run_id, enqueue_run.queue, 'queued', enqueue_run.priority, NULL, NULL, FALSE,
                enqueue_run.payload, v_run_at, enqueue_run.max_attempts, enqueue_run.payload_retention,
                v_now, v_now, 1,
                -- Only once the arguments passed, as the steps below read it.
                CASE WHEN current_setting('runrelay.trace_context', TRUE) <> '' THEN _setting_trace_context() END,
                enqueue_run.task
            FROM checked AS c
            WHERE c.ok
            ON CONFLICT ON CONSTRAINT runs_pkey DO NOTHING
            RETURNING r.run_id
        ),
        announced AS (
            INSERT INTO ledger_events AS l (
                run_id, lane, seq, type, payload, delivery_key, transport_only, created_at, next_attempt_at
            )
            SELECT
                c.run_id, 'lifecycle', 1, 'run.queued',
                jsonb_build_object(
                    'queue', enqueue_run.queue,
                    'run_at', v_run_at,
                    'priority', enqueue_run.priority,
                    'concurrency_key', NULL
                ),
                c.run_id || ':1', FALSE, v_now, v_now
            FROM created AS c
            RETURNING l.run_id
        ),
        laned AS (
            INSERT INTO ledger_lanes AS ll (run_id, lane, head_seq, available_at)
            SELECT a.run_id, 'lifecycle', 1, v_now FROM announced AS a
            ON CONFLICT ON CONSTRAINT ledger_lanes_pkey DO NOTHING
            RETURNING ll.run_id
        )
        SELECT
            (SELECT count(*) FROM created),
            (
                SELECT count(*)
                FROM (
                    SELECT
                        l.run_id,
                        (SELECT count(pg_notify(n.channel, l.run_id)) FROM _notifying('ledger') AS n (channel)) AS sent
                    FROM laned AS l
                ) AS x
            )
        INTO v_created, v_laned;
        IF v_created = 1 THEN
            IF v_laned = 0 THEN
                -- A lane row left for this run_id: the lane rule decides.
                PERFORM _lanes_on_write(ARRAY[enqueue_run.run_id], ARRAY['lifecycle'], ARRAY[1::bigint]);
            END IF;
            IF _runnable('queued', FALSE, v_run_at, v_now) THEN
                PERFORM pg_notify(n.channel, enqueue_run.queue) FROM _notifying('runs') AS n (channel);
            END IF;
            RETURN QUERY SELECT enqueue_run.run_id, 'queued'::text, TRUE;
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
    END IF;

    PERFORM _require_read_committed();
    PERFORM _check_enqueue('', enqueue_run.run_id, enqueue_run.queue, enqueue_run.payload, enqueue_run.run_at,
        enqueue_run.priority, enqueue_run.max_attempts, enqueue_run.payload_retention, enqueue_run.concurrency_key);
    PERFORM _check_id('task', enqueue_run.task, TRUE);
    -- One current_setting() when the producer traces nothing.
    IF current_setting('runrelay.trace_context', TRUE) <> '' THEN
        v_trace_context := _setting_trace_context();
    END IF;

    v_now := _now();
    v_run_at := coalesce(enqueue_run.run_at, v_now);

    SELECT r.* INTO v_existing FROM runs AS r WHERE r.run_id = enqueue_run.run_id;
    IF v_existing.run_id IS NULL THEN
        PERFORM _check_run_owner(ARRAY[enqueue_run.run_id], FALSE);
        IF enqueue_run.concurrency_key IS NOT NULL THEN
            PERFORM _lock_key(enqueue_run.concurrency_key);
            -- Fresh snapshot after the key lock: the key's live runs as committed now.
            v_held := EXISTS (
                SELECT 1 FROM runs AS k
                WHERE
                    k.concurrency_key = enqueue_run.concurrency_key
                    AND k.status IN ('queued', 'running', 'waiting')
            );
        END IF;
        INSERT INTO runs AS r (
            run_id, queue, status, priority, concurrency_key, key_position, key_held,
            payload, run_at, max_attempts, payload_retention, created_at, updated_at, ledger_seq, trace_context,
            task
        )
        VALUES (
            enqueue_run.run_id, enqueue_run.queue, 'queued', enqueue_run.priority,
            enqueue_run.concurrency_key,
            CASE WHEN enqueue_run.concurrency_key IS NOT NULL THEN nextval('runs_key_position_seq') END,
            v_held, enqueue_run.payload, v_run_at, enqueue_run.max_attempts,
            enqueue_run.payload_retention, v_now, v_now, 1, v_trace_context, enqueue_run.task
        )
        ON CONFLICT ON CONSTRAINT runs_pkey DO NOTHING
        RETURNING r.run_id INTO v_inserted;
        IF v_inserted IS NOT NULL THEN
            PERFORM _emit(enqueue_run.run_id, 'run.queued', jsonb_build_object(
                'queue', enqueue_run.queue,
                'run_at', v_run_at,
                'priority', enqueue_run.priority,
                'concurrency_key', enqueue_run.concurrency_key), FALSE, 1);
            IF _runnable('queued', v_held, v_run_at, v_now) THEN
                PERFORM pg_notify(n.channel, enqueue_run.queue) FROM _notifying('runs') AS n (channel);
            END IF;
            RETURN QUERY SELECT enqueue_run.run_id, 'queued'::text, TRUE;
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
        -- Lost a race with a concurrent enqueue of the same run_id, which committed.
        SELECT r.* INTO v_existing FROM runs AS r WHERE r.run_id = enqueue_run.run_id;
    END IF;

    IF v_existing.queue IS DISTINCT FROM enqueue_run.queue
        OR v_existing.payload IS DISTINCT FROM enqueue_run.payload
        OR v_existing.task IS DISTINCT FROM enqueue_run.task THEN
        PERFORM _enqueue_conflict('run_id', enqueue_run.run_id);
    END IF;
    RETURN QUERY SELECT v_existing.run_id, v_existing.status, FALSE;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION enqueue_run(text, text, jsonb, timestamptz, integer, integer, text, text, text) IS
'Creates a run (emitting run.queued), or returns the existing run with the same run_id, queue, task and payload.';
