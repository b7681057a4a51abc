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
    CONSTRAINT attempts_attempt CHECK (attempt >= 1),
    CONSTRAINT attempts_status CHECK (
        status IN (
            'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
            'resumed', 'released'
        )
    ),
    CONSTRAINT attempts_running_has_lease CHECK (
        status <> 'running' OR lease_expires_at IS NOT NULL
    ),
    CONSTRAINT attempts_finished_iff_ended CHECK (
        (
            status IN (
                'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
            )
        )
        = (finished_at IS NOT NULL)
    ),
    CONSTRAINT attempts_waiting_has_wait CHECK (
        status <> 'waiting' OR wait IS NOT NULL
    ),
    CONSTRAINT attempts_received_has_result CHECK (
        runner_result_received_at IS NULL OR runner_result IS NOT NULL
    ),
    -- What a fenced write that ended the live phase answered (SPEC §3.2):
    -- complete, fail / reap (retry_scheduled, failed), cancellation,
    -- suspend (waiting, or resumed when a stored signal woke it at once)
    -- and release_attempt.
    CONSTRAINT attempts_outcome CHECK (
        outcome IN (
            'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
            'resumed', 'released'
        )
    ),
    CONSTRAINT attempts_outcome_op CHECK ((outcome IS NULL) = (outcome_op IS NULL))
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- The reaper's path: live leases by expiry.
CREATE INDEX attempts_lease_expiry_idx ON attempts (lease_expires_at)
WHERE status = 'running';

-- Claim replays: the attempts a claim call opened.
CREATE INDEX attempts_call_id_idx ON attempts (call_id)
WHERE call_id IS NOT NULL;
