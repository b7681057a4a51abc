-- claim_detached_terminal(): the owner of a detached wait takes it back.
--
-- After record_runner_terminal, the attempt (still waiting) is moved to
-- running with a fresh 30 s lease so its owner — the holder of the lease
-- token — can write the terminal with complete_attempt or
-- fail_attempt(..., preserve_runner_terminal => true). The wait ends here:
-- run.resumed is emitted, transport-only, and the run's deadline is disarmed
-- (the lease governs from now on; if it lapses, reap_expired sends the
-- attempt back to waiting and restores the deadline). Locks: key, run row,
-- attempt row. Returns true when the attempt is (now, or already after an
-- earlier call) claimed for its terminal; false when there is no pushed
-- terminal to claim, the token or attempt is wrong, the claim window is over
-- (record_runner_terminal's deadline has passed, woken or not: time wins),
-- or a cancel marker was applied instead.
CREATE FUNCTION claim_detached_terminal(
    run_id text,
    attempt integer,
    lease_token uuid
)
RETURNS boolean
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
    v_run runs;
    v_attempt attempts;
    v_now timestamptz;
    v_granted timestamptz;
    v_seq bigint;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', claim_detached_terminal.run_id);
    PERFORM _check_token(claim_detached_terminal.attempt, claim_detached_terminal.lease_token);

    v_run := _lock_run(claim_detached_terminal.run_id);
    v_attempt := _lock_attempt(claim_detached_terminal.run_id, claim_detached_terminal.attempt);
    IF v_run.run_id IS NULL OR v_attempt.run_id IS NULL
        OR v_attempt.lease_token IS DISTINCT FROM claim_detached_terminal.lease_token
        OR v_attempt.attempt <> v_run.attempt_count
        OR v_run.status <> 'waiting'
        OR NOT _wait_detached(v_run.wait)
        OR v_attempt.runner_result_received_at IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, FALSE);
    END IF;
    IF v_attempt.status = 'running' THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, TRUE);
    END IF;
    v_now := _now();
    IF v_attempt.status <> 'waiting' OR v_run.wake_at <= v_now THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, FALSE);
    END IF;
    IF _apply_marker(v_run) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, FALSE);
    END IF;
    -- The lease is granted when the locks are held: a claim that waited for
    -- the run lock still hands over a full 30 s. (Whether the window is over
    -- is decided at the statement's start, as every deadline check is.)
    v_granted := _clock_now();
    UPDATE attempts AS a
    SET status = 'running', heartbeat_at = v_granted, lease_expires_at = v_granted + _lease(30)
    WHERE a.run_id = claim_detached_terminal.run_id AND a.attempt = claim_detached_terminal.attempt;
    UPDATE runs AS r
    SET wake_at = NULL, updated_at = v_now, ledger_seq = r.ledger_seq + 1
    WHERE r.run_id = claim_detached_terminal.run_id
    RETURNING r.ledger_seq INTO v_seq;
    PERFORM _emit(claim_detached_terminal.run_id, 'run.resumed',
        jsonb_build_object('attempt', claim_detached_terminal.attempt, 'resume', NULL), TRUE, v_seq);
    RETURN _restore_lock_wait(v_caller_lock_timeout, TRUE);
END;
$$;

COMMENT ON FUNCTION claim_detached_terminal(text, integer, uuid) IS
'Moves a waiting detached attempt with a pushed terminal back to running for its owner, within its claim window; true when claimed.';
