-- retry_run(): an operator runs a failed or cancelled run again, as a new
-- attempt series.
--
-- Outcomes:
--   retried        — the run was failed or cancelled: it is queued again
--                    (due at run_at, default now), its attempts keep their
--                    numbers and the next claim opens the next one;
--                    run.retried is emitted;
--   not_retryable  — the run is queued, running, waiting or completed:
--                    nothing changed;
--   not_found      — no such run.
-- The attempt budget: the attempts after the run's last one form a new
-- series (runs.series_start := attempt_count), and only the failed and lost
-- attempts of the current series count against max_attempts
-- (_retry_decision). max_attempts gives the new series its own budget
-- (1–1000); null keeps the run's. The last error stays on the run until the
-- next one replaces it; its attempts, their errors and its ledger stay as
-- they were (run_attempts, run_ledger_events).
--
-- run.retried records who and why: {attempt (the last of the old series),
-- previous_status, max_attempts, run_at, reason, requested_by (the operator,
-- as the caller names them), session_user (the database login that called)}.
--
-- A run with a concurrency key rejoins its key at the back, as a new
-- enqueue does: it is held behind the key's live runs, if any, and starts
-- after them (SPEC §3.1: runs of a key are strictly serial).
--
-- Locks: the call_id's lock (with a call_id), then the custody locks (the
-- key's row lock, the run row), waiting under the bounded lock wait
-- (10 s, or the caller's tighter lock_timeout; 55P03, nothing written);
-- the run's status is read after the locks, so of two concurrent retries
-- one answers retried and the other not_retryable. A cancel_run that reads
-- the run before this commits finds it ended (already_terminal); one that
-- reads it after cancels the retried run. A cancel marker of an ended run is
-- stale (cancel_run finds such a run already_terminal) and is dropped, so it
-- cannot cancel the retried run.
--
-- Replays: without call_id a repeat answers what the run's state says now
-- (not_retryable once retried). With call_id (a uuid the caller picks for
-- the call), a repeat of a call that answered retried answers retried again
-- and writes nothing, whatever happened to the run since; a repeat with
-- other arguments raises 22023. not_retryable and not_found changed nothing
-- and leave no record.
CREATE FUNCTION retry_run(
    run_id text,
    max_attempts integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    reason text DEFAULT NULL,
    requested_by text DEFAULT NULL,
    call_id uuid DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_digest bytea;
    v_recorded text;
    v_run runs;
    v_now timestamptz;
    v_run_at timestamptz;
    v_max_attempts integer;
    v_held boolean := FALSE;
    v_position bigint;
    v_seq bigint;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', retry_run.run_id);
    IF retry_run.max_attempts IS NOT NULL THEN
        PERFORM _check_int('max_attempts', retry_run.max_attempts, 1, 1000);
    END IF;
    PERFORM _check_time('run_at', retry_run.run_at);
    PERFORM _check_reason('reason', retry_run.reason);
    PERFORM _check_id('requested_by', retry_run.requested_by, TRUE);
    PERFORM _check_call_id(retry_run.call_id);

    IF retry_run.call_id IS NOT NULL THEN
        v_digest := _call_digest(jsonb_build_array(
            retry_run.max_attempts, retry_run.run_at, retry_run.reason, retry_run.requested_by));
        v_recorded := _recorded_call(retry_run.call_id, 'retry_run', retry_run.run_id, v_digest);
        IF v_recorded IS NOT NULL THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, v_recorded);
        END IF;
    END IF;

    v_run := _lock_run(retry_run.run_id);
    IF v_run.run_id IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_found');
    END IF;
    IF v_run.status NOT IN ('failed', 'cancelled') THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_retryable');
    END IF;

    DELETE FROM cancellations AS c WHERE c.run_id = retry_run.run_id;
    v_now := _now();
    v_run_at := coalesce(retry_run.run_at, v_now);
    v_max_attempts := coalesce(retry_run.max_attempts, v_run.max_attempts);
    IF v_run.concurrency_key IS NOT NULL THEN
        -- Under the key's lock (_lock_run): the key's live runs as committed now.
        v_held := EXISTS (
            SELECT 1 FROM runs AS k
            WHERE
                k.concurrency_key = v_run.concurrency_key
                AND k.status IN ('queued', 'running', 'waiting')
        );
        v_position := nextval('runs_key_position_seq');
    END IF;
    UPDATE runs AS r
    SET status = 'queued',
        run_at = v_run_at,
        finished_at = NULL,
        resume = NULL,
        cancel_reason = NULL,
        max_attempts = v_max_attempts,
        series_start = r.attempt_count,
        key_held = v_held,
        key_position = coalesce(v_position, r.key_position),
        updated_at = v_now,
        ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = retry_run.run_id
    RETURNING r.ledger_seq INTO v_seq;
    PERFORM _emit(retry_run.run_id, 'run.retried', jsonb_build_object(
        'attempt', v_run.attempt_count,
        'previous_status', v_run.status,
        'max_attempts', v_max_attempts,
        'run_at', v_run_at,
        'reason', retry_run.reason,
        'requested_by', retry_run.requested_by,
        'session_user', session_user), FALSE, v_seq);
    IF _runnable('queued', v_held, v_run_at, v_now) THEN
        PERFORM pg_notify(n.channel, v_run.queue) FROM _notifying('runs') AS n (channel);
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout,
        _record_call(retry_run.call_id, 'retry_run', retry_run.run_id, v_digest, 'retried'));
END;
$$;

COMMENT ON FUNCTION retry_run(text, integer, timestamptz, text, text, uuid) IS
'Queues a failed or cancelled run again as a new attempt series: retried, not_retryable or not_found; '
'a repeated call_id gets the first answer.';
