-- claim_detached_terminal(): the owner of a detached wait takes it back.
--
-- After record_runner_terminal, the attempt (still waiting) is moved to
-- running with a fresh 30 s lease so its owner — the holder of the lease
-- token — can write the terminal with complete_attempt or
-- fail_attempt(..., preserve_runner_terminal => true). The wait ends here:
-- run.resumed is emitted, transport-only. Locks: key, run row, attempt row.
-- Returns true when the attempt is (now, or already after an earlier call)
-- claimed for its terminal; false when there is no pushed terminal to claim,
-- the token or attempt is wrong, or a cancel marker was applied instead.
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
SET lock_timeout = '10s'
AS $$
DECLARE
    v_run runs;
    v_attempt attempts;
    v_now timestamptz;
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
        OR v_run.wait ->> 'kind' IS DISTINCT FROM 'detached_runner'
        OR v_attempt.runner_result_received_at IS NULL THEN
        RETURN FALSE;
    END IF;
    IF v_attempt.status = 'running' THEN
        RETURN TRUE;
    END IF;
    IF v_attempt.status <> 'waiting' THEN
        RETURN FALSE;
    END IF;
    IF _apply_marker(v_run) THEN
        RETURN FALSE;
    END IF;
    v_now := _now();
    UPDATE attempts AS a
    SET status = 'running', heartbeat_at = v_now, lease_expires_at = v_now + _lease(30)
    WHERE a.run_id = claim_detached_terminal.run_id AND a.attempt = claim_detached_terminal.attempt;
    PERFORM _emit(claim_detached_terminal.run_id, 'run.resumed',
        jsonb_build_object('attempt', claim_detached_terminal.attempt, 'resume', NULL), TRUE);
    RETURN TRUE;
END;
$$;

COMMENT ON FUNCTION claim_detached_terminal(text, integer, uuid) IS
'Moves a waiting detached attempt with a pushed terminal back to running for its owner; true when claimed.';
