-- An attempt: one execution of a run, fenced by its lease token.
--
-- outcome/outcome_op record what the write that ended the attempt's live
-- phase answered, so that the same call repeated after a lost reply answers
-- the same (SPEC: "Replays are exact"). call_id remembers the claim call that
-- opened the attempt, for claim replays.
--
-- Ended statuses: completed, failed, lost (a reaped lease), cancelled,
-- resumed (a wait ended) and released (release_attempt handed the run back).
-- Only failed and lost attempts count against the run's max_attempts.

-- _attempts_rules(): the row rules of an attempt, called by the
-- attempts_rules CHECK below. Built as _runs_rules (02_runs.sql) is, for the
-- same reason, and state in the same way: a broken rule fails with the error a
-- CHECK constraint of its name raises (23514, `new row for relation
-- "attempts" violates check constraint "attempts_status"`), the first broken
-- rule by name when there are several.
--
-- attempts_outcome lists what a fenced write that ended the live phase
-- answered (SPEC §3.2): complete, fail / reap (retry_scheduled, failed),
-- cancellation, suspend (waiting, or resumed when a stored signal woke it at
-- once) and release_attempt.
CREATE FUNCTION _attempts_rules(
    p_attempt integer,
    p_status text,
    p_lease_expires_at timestamptz,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_runner_result_received_at timestamptz,
    p_runner_result jsonb,
    p_outcome text,
    p_outcome_op text
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
        WHEN NOT (p_attempt >= 1) THEN 'attempts_attempt'
        WHEN NOT (
            (
                p_status IN (
                    'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
                )
            )
            = (p_finished_at IS NOT NULL)
        ) THEN 'attempts_finished_iff_ended'
        WHEN NOT (
            p_outcome IN (
                'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
                'resumed', 'released'
            )
        ) THEN 'attempts_outcome'
        WHEN NOT ((p_outcome IS NULL) = (p_outcome_op IS NULL))
            THEN 'attempts_outcome_op'
        WHEN NOT (p_runner_result_received_at IS NULL OR p_runner_result IS NOT NULL)
            THEN 'attempts_received_has_result'
        WHEN NOT (p_status <> 'running' OR p_lease_expires_at IS NOT NULL)
            THEN 'attempts_running_has_lease'
        WHEN NOT (
            p_status IN (
                'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
                'resumed', 'released'
            )
        ) THEN 'attempts_status'
        WHEN NOT (p_status <> 'waiting' OR p_wait IS NOT NULL)
            THEN 'attempts_waiting_has_wait'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "attempts" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'attempts';
END;
$$;

COMMENT ON FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
) IS
'The row rules of attempts (the attempts_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

CREATE TABLE attempts (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    worker text NOT NULL,
    lease_token uuid NOT NULL,
    status text NOT NULL,
    claimed_at timestamptz NOT NULL,
    heartbeat_at timestamptz,
    lease_expires_at timestamptz,
    runner_result jsonb,
    runner_result_received_at timestamptz,
    error jsonb,
    finished_at timestamptz,
    call_id uuid,
    wait jsonb,
    outcome text,
    outcome_op text,
    -- The attempt's place in the claim that opened it (1, 2, ...), so that a
    -- replayed claim answers in exactly the original order.
    claim_position integer,
    PRIMARY KEY (run_id, attempt),
    -- Every row rule of an attempt, one per name; see _attempts_rules above.
    CONSTRAINT attempts_rules CHECK (
        _attempts_rules(
            attempt, status, lease_expires_at, finished_at, wait,
            runner_result_received_at, runner_result, outcome, outcome_op
        )
    )
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- The reaper's path: live leases by expiry.
CREATE INDEX attempts_lease_expiry_idx ON attempts (lease_expires_at)
WHERE status = 'running';

-- Claim replays: the attempts a claim call opened.
CREATE INDEX attempts_call_id_idx ON attempts (call_id)
WHERE call_id IS NOT NULL;

-- list_processes(): the workers seen in the last hour, from the attempts
-- that ended in it (the running ones come from attempts_lease_expiry_idx).
-- Partial: a claim or a heartbeat writes no entry here; a completion writes
-- one, in an update that is already not HOT (it changes status, a column
-- of attempts_lease_expiry_idx's predicate).
CREATE INDEX attempts_finished_idx ON attempts (finished_at)
WHERE finished_at IS NOT NULL;
