-- _claim(): the claim behind claim_attempts and settle_and_claim, after
-- their validation: p_queues and p_tasks as _check_names returns them
-- (null: every queue, or runs of any task and untyped ones; else only those
-- queues, or runs of those tasks), p_lease as _lease returns it. Returns the claimed attempts in claim order (an array, not a
-- set: the callers return them in their own row shapes).
--
-- Runnable (_runnable, _internal/runnable.sql): status queued, run_at due,
-- not held behind an earlier run of its concurrency key; best first
-- (priority DESC, run_at). Candidates are locked
-- FOR UPDATE SKIP LOCKED from the partial claim indexes (one index range per
-- queue, merged), so concurrent claimers never wait on one another and never
-- take the same run; the status re-check on the locked row guards the rest.
--
-- Before claiming, waits whose time has come on these queues are woken
-- (a due sleep; an event or detached_runner wait past timeout_at with resume
-- {"timed_out": true}), so no external scheduler is needed.
--
-- A candidate with a cancel marker is cancelled instead of started. The
-- others start together: one statement opens every attempt, one appends every
-- run.started, so a claim of 100 runs costs the statements of a claim of 1.
-- Each claimed attempt carries its run's recorded steps (as _steps_of: one
-- primary-key range of steps per run, null when it has none).
-- Replay: with call_id, a repeated call returns the attempts the first call
-- opened (for the same worker), in the same order (attempts.claim_position),
-- and opens nothing; if the first call rolled back there is nothing to find
-- and the call claims afresh.
CREATE FUNCTION _claim(
    p_worker text, p_queues text[], p_tasks text[], p_max_runs integer, p_lease interval, p_call_id uuid
)
RETURNS claim_attempts_result[]
LANGUAGE plpgsql
VOLATILE
-- Every statement here is a key or index-range look-up; a never-analysed
-- install planned the call_id look-up as a scan of attempts (as _complete).
SET enable_seqscan = off
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz;
    v_granted timestamptz;
    v_replay boolean;
    v_due boolean;
    v_paused boolean;
    v_queues text[];
    v_run runs;
    v_run_id text;
    v_run_ids text[];
    v_claimed claim_attempts_result[];
    v_marked text[];
    v_woken text[];
    v_seqs bigint[];
    v_seq bigint;
    v_head bigint;
BEGIN
    -- One statement asks three things. Was this call_id's claim made
    -- already (a replay)? The look-up is ordered by call_id, not an EXISTS:
    -- without statistics an EXISTS expects many matches and plans a
    -- sequential scan that "finds the first at once" (and walks the whole
    -- table when there is none); ordered, only the call_id index gives the
    -- first row without a sort, and without a call_id it is a probe for a
    -- NULL key, which finds nothing at once. (The callers force generic
    -- plans, so no custom plan folds it away and is re-planned every call.)
    --
    -- Is a wait due? Bounded so one claim never does unbounded work: with
    -- more than 1000 waits falling due at once, each claim wakes the 1000
    -- oldest. The check is the earliest wake_at, which the planner always
    -- answers with one probe of runs_wake_any_idx; an EXISTS over
    -- `wake_at <= now` may be planned as a scan over every waiting run (a
    -- generic plan cannot see how few are due).
    --
    -- Is any queue paused (pause_queue)? A scan of a table that is empty
    -- unless an operator paused a queue, so a claim pays nothing more for
    -- pauses than this one look while there are none. Paused queues' waits
    -- are still woken: a woken run is only queued.
    v_now := _now();
    SELECT
        (
            SELECT a.call_id FROM attempts AS a
            WHERE a.call_id = p_call_id
            ORDER BY a.call_id
            LIMIT 1
        ) IS NOT NULL,
        (SELECT min(w.wake_at) FROM runs AS w) <= v_now,
        EXISTS (SELECT FROM paused_queues AS p)
    INTO v_replay, v_due, v_paused;
    IF v_replay THEN
        RETURN ARRAY(
            SELECT (
                a.run_id, a.attempt, a.lease_token, r.queue, r.payload, r.resume, a.lease_expires_at, r.task,
                _steps_of(a.run_id)
            )::claim_attempts_result
            FROM attempts AS a
            INNER JOIN runs AS r ON a.run_id = r.run_id
            WHERE a.call_id = p_call_id AND a.worker = p_worker
            ORDER BY a.claim_position  -- the order the claim took them in
        );
    END IF;
    IF v_due THEN
        PERFORM _end_due_waits(p_queues, 1000);
    END IF;

    -- While a queue is paused, the claim names the queues it may take from:
    -- those of p_queues that are not paused, or, for every queue, each queue
    -- with runnable runs but the paused ones (_unpaused_queues), and claims
    -- as a claim naming them does.
    v_queues := p_queues;
    IF v_paused THEN
        v_queues := _unpaused_queues(p_queues);
        IF cardinality(v_queues) = 0 THEN
            RETURN '{}'::claim_attempts_result[];
        END IF;
    END IF;

    v_run_ids := _claim_candidates(v_queues, p_tasks, p_max_runs, v_now);
    IF cardinality(v_run_ids) = 0 THEN
        RETURN '{}'::claim_attempts_result[];
    END IF;

    -- A lease runs from the moment it is granted: the clock is read now,
    -- after the candidates are locked, not at statement start. settle_and_claim
    -- claims after settlements that may have waited up to the lock bound, and
    -- a lease counted from statement time would be short by that wait (or
    -- already expired). v_now still decides what is due and runnable.
    v_granted := _clock_now();

    -- One candidate (a claim of one run: a worker's call after each job)
    -- starts by a statement of its own, scalar, with what the statement
    -- below does for it: in a snapshot taken after its lock, unless it has a
    -- cancel marker, the run, its attempt, run.started, its recorded steps
    -- and the lane's head. A candidate it does not start (a marker) goes to
    -- the statement below, which sets it aside as it sets aside every marked
    -- candidate. runrelay.reference_paths turns this off
    -- (tests/pgtap/027_settle_and_claim.sql holds the two to the same rows).
    IF cardinality(v_run_ids) = 1 AND _fast_paths() THEN
        WITH started AS (
            UPDATE runs AS r
            SET status = 'running', attempt_count = r.attempt_count + 1, updated_at = v_now,
                ledger_seq = r.ledger_seq + 1
            WHERE
                r.run_id = v_run_ids[1]
                AND _runnable(r.status, r.key_held, r.run_at, v_now)
                AND (SELECT TRUE FROM cancellations AS m WHERE m.run_id = v_run_ids[1]) IS NULL
            RETURNING
                r.run_id, r.attempt_count AS attempt, r.ledger_seq AS seq, r.queue, r.payload, r.resume, r.task
        ),
        opened AS (
            INSERT INTO attempts AS a (
                run_id, attempt, worker, lease_token, status, claimed_at, heartbeat_at,
                lease_expires_at, call_id, claim_position
            )
            SELECT
                s.run_id, s.attempt, p_worker, gen_random_uuid(), 'running', v_granted, v_granted,
                v_granted + p_lease, p_call_id, 1
            FROM started AS s
            RETURNING a.lease_token
        ),
        announced AS (
            INSERT INTO ledger_events AS l (
                run_id, lane, seq, type, payload, delivery_key, transport_only,
                created_at, next_attempt_at
            )
            SELECT
                s.run_id, 'lifecycle', s.seq, 'run.started', jsonb_build_object('attempt', s.attempt, 'worker', p_worker),
                s.run_id || ':' || s.seq, FALSE, v_now, v_now
            FROM started AS s
            RETURNING l.seq
        )
        SELECT
            ARRAY[(
                s.run_id, s.attempt, o.lease_token, s.queue, s.payload, s.resume, v_granted + p_lease, s.task,
                (SELECT jsonb_object_agg(st.step, st.result) FROM steps AS st WHERE st.run_id = s.run_id)
            )::claim_attempts_result],
            e.seq,
            (SELECT t.head_seq FROM ledger_lanes AS t WHERE t.run_id = s.run_id AND t.lane = 'lifecycle')
        INTO v_claimed, v_seq, v_head
        FROM started AS s
        CROSS JOIN opened AS o
        CROSS JOIN announced AS e;
        IF FOUND THEN
            IF v_head IS NULL THEN
                PERFORM _lanes_on_write(v_run_ids, ARRAY['lifecycle'], ARRAY[v_seq]);
            END IF;
            RETURN v_claimed;
        END IF;
    END IF;

    -- The candidates start together, in claim order, in one statement: it
    -- re-reads each locked row (the candidate scan's snapshot may predate a
    -- commit that changed it, e.g. attempt_count), sets aside those with a
    -- cancel marker (a probe per candidate, in this snapshot, taken after the
    -- candidates were locked), opens the others' attempts, reads their
    -- recorded steps (one primary-key range of steps per run: the claim holds
    -- the run's row, and a step is recorded only under it) and appends their
    -- run.started events, as _emit_lifecycle does: the same rows, and each
    -- lane's head read in the same statement, so that only a lane with
    -- nothing pending goes to _lanes_on_write (most claims meet a live head
    -- and write their events in this one statement).
    WITH fresh AS (
        SELECT
            r.run_id, r.tid, c.ord,
            (SELECT TRUE FROM cancellations AS m WHERE m.run_id = r.run_id) IS NOT NULL AS marked
        -- generate_subscripts, not unnest: unnest's row estimate is the array's
        -- length in a custom plan and 10 in the generic one, so custom plans
        -- always looked cheaper and PostgreSQL re-planned this statement on
        -- every call (a third of a single claim's server time); this estimate
        -- is the same in both, and the generic plan is kept.
        FROM generate_subscripts(v_run_ids, 1) AS c (ord)
        -- One primary-key probe per candidate. LIMIT keeps it a probe: joined
        -- flat, the status filters match the claim indexes and the planner
        -- may read every queued run and hash them against the candidates.
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.ctid AS tid, r.status, r.key_held, r.run_at
            FROM runs AS r WHERE r.run_id = v_run_ids[c.ord] LIMIT 1
        ) AS r
        WHERE _runnable(r.status, r.key_held, r.run_at, v_now)
    ),
    started AS (
        UPDATE runs AS r
        SET status = 'running', attempt_count = r.attempt_count + 1, updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        FROM fresh AS f
        -- Where the probe found it: the row is locked, so it has not moved.
        -- (Joined by run_id, a generic plan may merge the candidates with
        -- the whole primary key.)
        WHERE r.ctid = f.tid AND NOT f.marked
        RETURNING
            r.run_id, r.attempt_count AS attempt, r.ledger_seq AS seq, r.queue, r.payload, r.resume, r.task, f.ord
    ),
    opened AS (
        INSERT INTO attempts AS a (
            run_id, attempt, worker, lease_token, status, claimed_at, heartbeat_at,
            lease_expires_at, call_id, claim_position
        )
        SELECT
            s.run_id, s.attempt, p_worker, gen_random_uuid(), 'running', v_granted, v_granted,
            v_granted + p_lease, p_call_id, s.ord
        FROM started AS s
        RETURNING a.run_id, a.lease_token
    ),
    announced AS (
        INSERT INTO ledger_events AS l (
            run_id, lane, seq, type, payload, delivery_key, transport_only,
            created_at, next_attempt_at
        )
        SELECT
            s.run_id, 'lifecycle', s.seq, 'run.started', jsonb_build_object('attempt', s.attempt, 'worker', p_worker),
            s.run_id || ':' || s.seq, FALSE, v_now, v_now
        FROM started AS s
        RETURNING l.run_id, l.seq
    )
    SELECT
        array_agg(
            (
                s.run_id, s.attempt, o.lease_token, s.queue, s.payload, s.resume, v_granted + p_lease, s.task,
                (SELECT jsonb_object_agg(st.step, st.result) FROM steps AS st WHERE st.run_id = s.run_id)
            )::claim_attempts_result
            ORDER BY s.ord
        ),
        array_agg(e.run_id) FILTER (WHERE h.head_seq IS NULL),
        array_agg(e.seq) FILTER (WHERE h.head_seq IS NULL),
        (SELECT array_agg(f.run_id ORDER BY f.run_id COLLATE "C") FROM fresh AS f WHERE f.marked)
    INTO v_claimed, v_woken, v_seqs, v_marked
    FROM started AS s
    INNER JOIN opened AS o ON s.run_id = o.run_id
    INNER JOIN announced AS e ON s.run_id = e.run_id
    LEFT JOIN LATERAL (
        SELECT t.head_seq FROM ledger_lanes AS t
        WHERE t.run_id = e.run_id AND t.lane = 'lifecycle'
        LIMIT 1
    ) AS h ON TRUE;

    -- A candidate with a cancel marker is cancelled instead of started.
    -- Rare, so one run at a time. Its row is still locked (a candidate), so
    -- what the statement above read of it holds.
    FOREACH v_run_id IN ARRAY coalesce(v_marked, '{}'::text[]) LOOP
        SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = v_run_id;
        -- Ending a keyed run needs its key lock; never wait for it here.
        IF v_run.concurrency_key IS NULL OR _try_lock_key(v_run.concurrency_key) THEN
            PERFORM _apply_marker(v_run);
        END IF;
    END LOOP;

    IF v_woken IS NOT NULL THEN
        PERFORM _lanes_on_write(v_woken, array_fill('lifecycle'::text, ARRAY[cardinality(v_woken)]), v_seqs);
    END IF;
    RETURN coalesce(v_claimed, '{}'::claim_attempts_result[]);
END;
$$;

COMMENT ON FUNCTION _claim(text, text[], text[], integer, interval, uuid) IS
'Claims up to p_max_runs runnable runs and opens their attempts (callers validated the input); in claim order.';

-- _steps_of(): a run's recorded steps as claims return them, step name ->
-- result; null when it has none. A range of steps' primary key. The claim
-- holds the run's row, and a step is recorded only under it.
CREATE FUNCTION _steps_of(p_run_id text)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (
        SELECT jsonb_object_agg(s.step, s.result) FROM steps AS s
        WHERE s.run_id = p_run_id
    );
END;
$$;

COMMENT ON FUNCTION _steps_of(text) IS
'A run''s recorded steps, step name -> result, null when none (one range of the steps key).';
