-- claim_attempts(): take up to max_runs runnable runs and open an attempt on each.
--
-- Runnable: status queued, run_at due, not held behind an earlier run of its
-- concurrency key; best first (priority DESC, run_at). Candidates are locked
-- FOR UPDATE SKIP LOCKED from the partial claim indexes (one index range per
-- queue, merged), so concurrent claimers never wait on one another and never
-- take the same run; the status re-check on the locked row guards the rest.
--
-- Before claiming, waits whose time has come on these queues are woken
-- (a due sleep; an event or detached_runner wait past timeout_at with resume
-- {"timed_out": true}), so no external scheduler is needed.
--
-- A candidate with a cancel marker is cancelled instead of started.
-- Replay: with call_id, a repeated call returns the attempts the first call
-- opened (for the same worker) and opens nothing; if the first call rolled
-- back there is nothing to find and the call claims afresh.
CREATE TYPE claim_attempts_result AS (
    run_id text,
    attempt integer,
    lease_token uuid,
    queue text,
    payload jsonb,
    resume jsonb,
    lease_expires_at timestamptz
);

CREATE FUNCTION claim_attempts(
    worker text,
    queues text[] DEFAULT NULL,
    max_runs integer DEFAULT 1,
    lease_seconds integer DEFAULT 30,
    call_id uuid DEFAULT NULL
)
RETURNS SETOF claim_attempts_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz;
    v_lease interval := _lease(claim_attempts.lease_seconds);
    v_queues text[];
    v_queue text;
    v_run runs;
    v_run_id text;
    v_attempt integer;
    v_token uuid;
    v_seq bigint;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('worker', claim_attempts.worker);
    PERFORM _check_int('max_runs', claim_attempts.max_runs, 1, 1000);
    IF claim_attempts.queues IS NOT NULL THEN
        IF cardinality(claim_attempts.queues) NOT BETWEEN 1 AND 100
            OR array_ndims(claim_attempts.queues) > 1 THEN
            PERFORM _invalid('queues',
                'must be a one-dimensional array of 1 to 100 queue names, or null for every queue',
                'Pass null to claim from every queue, or a non-empty array of queue names.');
        END IF;
        FOREACH v_queue IN ARRAY claim_attempts.queues LOOP
            PERFORM _check_id('queues', v_queue);
        END LOOP;
        SELECT array_agg(DISTINCT q.name) INTO v_queues FROM unnest(claim_attempts.queues) AS q (name);
    END IF;

    IF claim_attempts.call_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM attempts AS a WHERE a.call_id = claim_attempts.call_id
    ) THEN
        RETURN QUERY
        SELECT a.run_id, a.attempt, a.lease_token, r.queue, r.payload, r.resume, a.lease_expires_at
        FROM attempts AS a
        INNER JOIN runs AS r ON a.run_id = r.run_id
        WHERE a.call_id = claim_attempts.call_id AND a.worker = claim_attempts.worker
        ORDER BY r.priority DESC, r.run_at, r.run_id;  -- the order the claim took them in
        RETURN;
    END IF;

    -- Bounded so one claim never does unbounded work: with more than 1000
    -- waits falling due at once, each claim wakes the 1000 oldest. The check
    -- is the earliest wake_at, which the planner always answers with one probe
    -- of runs_wake_any_idx; an EXISTS over `wake_at <= now` may be planned as
    -- a scan over every waiting run (a generic plan cannot see how few are due).
    v_now := _now();
    IF (SELECT min(w.wake_at) FROM runs AS w) <= v_now THEN
        PERFORM _wake_due(v_queues, 1000);
    END IF;

    FOR v_run_id IN
        SELECT c.run_id FROM _claim_candidates(v_queues, claim_attempts.max_runs, v_now) AS c
    LOOP
        -- A fresh read of the row we now hold locked: the candidate scan's
        -- snapshot may predate a commit that changed it (e.g. attempt_count).
        SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = v_run_id;
        IF v_run.status <> 'queued' OR v_run.key_held OR v_run.run_at > v_now THEN
            CONTINUE;
        END IF;
        IF (_cancel_reason(v_run.run_id)).requested THEN
            -- Ending a keyed run needs its key lock; never wait for it here.
            IF v_run.concurrency_key IS NULL
                OR pg_try_advisory_xact_lock(_key_lock_id(v_run.concurrency_key)) THEN
                PERFORM _apply_marker(v_run);
            END IF;
            CONTINUE;
        END IF;
        v_attempt := v_run.attempt_count + 1;
        v_token := gen_random_uuid();
        UPDATE runs AS r
        SET status = 'running', attempt_count = v_attempt, updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        WHERE r.run_id = v_run.run_id
        RETURNING r.ledger_seq INTO v_seq;
        INSERT INTO attempts (
            run_id, attempt, worker, lease_token, status, claimed_at, heartbeat_at,
            lease_expires_at, call_id
        )
        VALUES (
            v_run.run_id, v_attempt, claim_attempts.worker, v_token, 'running', v_now, v_now,
            v_now + v_lease, claim_attempts.call_id
        );
        PERFORM _emit(v_run.run_id, 'run.started', jsonb_build_object(
            'attempt', v_attempt, 'worker', claim_attempts.worker), FALSE, v_seq);
        RETURN NEXT (v_run.run_id, v_attempt, v_token, v_run.queue, v_run.payload, v_run.resume, v_now + v_lease)::claim_attempts_result;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION claim_attempts(text, text[], integer, integer, uuid) IS
'Claims up to max_runs runnable runs (priority, then run_at; SKIP LOCKED), opening a leased attempt on each.';
