-- State transitions shared by the public functions. Every one of them assumes
-- the caller holds the run's custody locks (and, for transitions that end a
-- run with a concurrency key, the key lock).

-- Promote the next run of a key: among its live runs the one with the
-- smallest key_position becomes claimable. Called under the key lock after
-- a run of the key ended, so the invariant "exactly the key's head is not
-- key_held" holds at every commit.
CREATE FUNCTION _promote_key(p_key text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_queue text;
    v_status text;
    v_key_held boolean;
    v_run_at timestamptz;
BEGIN
    UPDATE runs AS r
    SET key_held = FALSE
    FROM (
        SELECT h.run_id
        FROM runs AS h
        WHERE
            h.concurrency_key = p_key
            AND h.status IN ('queued', 'running', 'waiting')
        ORDER BY h.key_position
        LIMIT 1
    ) AS head
    WHERE r.run_id = head.run_id AND r.key_held
    RETURNING r.queue, r.status, r.key_held, r.run_at INTO v_queue, v_status, v_key_held, v_run_at;
    IF v_queue IS NOT NULL AND _runnable(v_status, v_key_held, v_run_at, _now()) THEN
        PERFORM pg_notify(n.channel, v_queue) FROM _notifying('runs') AS n (channel);
    END IF;
END;
$$;

COMMENT ON FUNCTION _promote_key(text) IS
'Makes the oldest live run of a concurrency key claimable (caller holds the key lock).';

-- Bookkeeping when runs reach a terminal status (p_status), for each of
-- p_run_ids with its concurrency key (p_keys[i], NULL for none): its cancel
-- marker is dropped (one that committed after the run's fence lost to the
-- ending), runrelay_terminal is notified (unless settings.notifications
-- turns it off), and each distinct key's next run is promoted, in key order
-- (the caller holds those key locks). Returns how many notifications it
-- sent: every run given, or none.
CREATE FUNCTION _ended(p_run_ids text[], p_status text, p_keys text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text;
    v_notified integer;
BEGIN
    -- One statement: the markers go, and each run's terminal notification.
    -- generate_subscripts, not unnest: the same row estimate in custom and
    -- generic plans, so the generic plan is kept (see claim_attempts).
    WITH gone AS (
        DELETE FROM cancellations AS c
        USING generate_subscripts(p_run_ids, 1) AS g (i)
        CROSS JOIN LATERAL (
            SELECT t.ctid AS tid FROM cancellations AS t WHERE t.run_id = p_run_ids[g.i] LIMIT 1
        ) AS x
        WHERE c.ctid = x.tid
    )
    SELECT count(pg_notify(n.channel, json_build_object('run_id', p_run_ids[g.i], 'status', p_status)::text))
    INTO v_notified
    FROM generate_subscripts(p_run_ids, 1) AS g (i)
    CROSS JOIN _notifying('terminal') AS n (channel);
    IF cardinality(array_remove(p_keys, NULL)) > 0 THEN
        FOR v_key IN
            SELECT d.key
            FROM (SELECT DISTINCT p_keys[g.i] AS key FROM generate_subscripts(p_keys, 1) AS g (i)) AS d
            WHERE d.key IS NOT NULL
            ORDER BY d.key COLLATE "C"
        LOOP
            PERFORM _promote_key(v_key);
        END LOOP;
    END IF;
    RETURN v_notified;
END;
$$;

COMMENT ON FUNCTION _ended(text[], text, text[]) IS
'After runs end: drops their cancel markers, notifies runrelay_terminal, promotes their keys; returns the notifications sent.';

-- Apply a cancellation: live attempts and the run become cancelled.
CREATE FUNCTION _cancel(p_run runs, p_reason text, p_outcome_op text DEFAULT NULL, p_attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_seq bigint;
    v_held record;
BEGIN
    -- A handler still runs the run's running attempt (unless it is the
    -- caller's own, whose write answers cancelled): tell its worker now, on
    -- <schema>_cancel, rather than at its next heartbeat. Sent on commit.
    FOR v_held IN
        SELECT a.attempt, a.worker FROM attempts AS a
        WHERE
            a.run_id = p_run.run_id
            AND a.status = 'running'
            AND a.attempt IS DISTINCT FROM p_attempt
    LOOP
        PERFORM pg_notify(n.channel, jsonb_build_object(
            'run_id', p_run.run_id, 'attempt', v_held.attempt, 'worker', v_held.worker
        )::text) FROM _notifying('cancel') AS n (channel);
    END LOOP;
    UPDATE attempts AS a
    SET status = 'cancelled',
        finished_at = v_now,
        outcome = CASE WHEN a.attempt = p_attempt THEN 'cancelled' ELSE a.outcome END,
        outcome_op = CASE WHEN a.attempt = p_attempt THEN p_outcome_op ELSE a.outcome_op END
    WHERE a.run_id = p_run.run_id AND a.status IN ('running', 'waiting');
    UPDATE runs AS r
    SET status = 'cancelled',
        cancel_reason = p_reason,
        finished_at = v_now,
        updated_at = v_now,
        wait = NULL,
        wake_at = NULL,
        key_held = FALSE,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = p_run.run_id
    RETURNING r.ledger_seq INTO v_seq;
    PERFORM _emit(p_run.run_id, 'run.cancelled',
        jsonb_build_object('attempt', p_run.attempt_count, 'reason', p_reason), FALSE, v_seq);
    PERFORM _ended(ARRAY[p_run.run_id], 'cancelled', ARRAY[p_run.concurrency_key]);
END;
$$;

COMMENT ON FUNCTION _cancel(runs, text, text, integer) IS
'Cancels a run and its live attempts, emits run.cancelled (caller holds the custody locks).';

-- If a cancel marker exists (fresh snapshot), apply it and return true.
CREATE FUNCTION _apply_marker(p_run runs, p_outcome_op text DEFAULT NULL, p_attempt integer DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_marker record;
BEGIN
    v_marker := _cancel_reason(p_run.run_id);
    IF NOT v_marker.requested THEN
        RETURN FALSE;
    END IF;
    PERFORM _cancel(p_run, v_marker.reason, p_outcome_op, p_attempt);
    RETURN TRUE;
END;
$$;

COMMENT ON FUNCTION _apply_marker(runs, text, integer) IS
'Applies a pending cancel marker after the custody locks are held; true if it did.';

-- A waiting run wakes: its waiting (or prepared) attempt is resumed and the
-- run is queued again with `p_resume` for its next attempt.
CREATE FUNCTION _end_wait(p_run runs, p_resume jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_seq bigint;
BEGIN
    UPDATE attempts AS a
    SET status = 'resumed', finished_at = v_now
    WHERE
        a.run_id = p_run.run_id
        AND a.attempt = p_run.attempt_count
        AND a.status IN ('waiting', 'running');
    UPDATE runs AS r
    SET status = 'queued',
        wait = NULL,
        wake_at = NULL,
        resume = p_resume,
        run_at = v_now,
        updated_at = v_now,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = p_run.run_id
    RETURNING r.ledger_seq INTO v_seq;
    PERFORM _emit(p_run.run_id, 'run.resumed',
        jsonb_build_object('attempt', p_run.attempt_count, 'resume', p_resume),
        _wait_detached(p_run.wait), v_seq);
    PERFORM pg_notify(n.channel, p_run.queue) FROM _notifying('runs') AS n (channel);
END;
$$;

COMMENT ON FUNCTION _end_wait(runs, jsonb) IS
'Resumes a waiting run: attempt resumed, run queued with resume, run.resumed emitted.';

-- End an attempt in failure (status failed or lost) and apply what the retry
-- policy (_retry_decision, retry.sql) decides for the run: another attempt,
-- or the run fails. Returns 'retry_scheduled' or 'failed'.
CREATE FUNCTION _fail(
    p_run runs,
    p_attempt integer,
    p_attempt_status text,
    p_error jsonb,
    p_retry_at timestamptz,
    p_outcome_op text
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_outcome text;
    v_run_at timestamptz;
    v_seq bigint;
    v_key_held boolean;
BEGIN
    SELECT d.outcome, d.run_at INTO v_outcome, v_run_at
    FROM _retry_decision(p_run, p_attempt, p_retry_at, v_now) AS d;

    UPDATE attempts AS a
    SET status = p_attempt_status,
        error = p_error,
        finished_at = v_now,
        outcome = v_outcome,
        outcome_op = p_outcome_op
    WHERE a.run_id = p_run.run_id AND a.attempt = p_attempt;

    IF v_outcome = 'retry_scheduled' THEN
        UPDATE runs AS r
        SET status = 'queued',
            run_at = v_run_at,
            error = p_error,
            wait = NULL,
            wake_at = NULL,
            updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        WHERE r.run_id = p_run.run_id
        RETURNING r.ledger_seq, r.key_held INTO v_seq, v_key_held;
        PERFORM _emit(p_run.run_id, 'run.retry_scheduled', jsonb_build_object(
            'attempt', p_attempt, 'run_at', v_run_at, 'error', p_error), FALSE, v_seq);
        IF _runnable('queued', v_key_held, v_run_at, v_now) THEN
            PERFORM pg_notify(n.channel, p_run.queue) FROM _notifying('runs') AS n (channel);
        END IF;
    ELSE
        UPDATE runs AS r
        SET status = 'failed',
            error = p_error,
            wait = NULL,
            wake_at = NULL,
            finished_at = v_now,
            updated_at = v_now,
            ledger_seq = r.ledger_seq + 1
        WHERE r.run_id = p_run.run_id
        RETURNING r.ledger_seq INTO v_seq;
        PERFORM _emit(p_run.run_id, 'run.failed', jsonb_build_object(
            'attempt', p_attempt, 'error', p_error), FALSE, v_seq);
        PERFORM _ended(ARRAY[p_run.run_id], 'failed', ARRAY[p_run.concurrency_key]);
    END IF;
    RETURN v_outcome;
END;
$$;

COMMENT ON FUNCTION _fail(runs, integer, text, jsonb, timestamptz, text) IS
'Ends an attempt in failure and retries or fails the run by max_attempts (caller holds the custody locks).';
