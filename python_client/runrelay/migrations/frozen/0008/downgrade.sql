-- Revision 0008, the row rules of runs and attempts: back to one CHECK
-- constraint per rule, exactly as 0007 declared them. Rows written under 0008
-- passed the same rules, so the constraints are added valid.
ALTER TABLE runs
    DROP CONSTRAINT runs_rules,
    ADD CONSTRAINT runs_run_id_length CHECK (length(run_id) BETWEEN 1 AND 200),
    ADD CONSTRAINT runs_queue_length CHECK (length(queue) BETWEEN 1 AND 200),
    ADD CONSTRAINT runs_status CHECK (
        status IN (
            'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
        )
    ),
    ADD CONSTRAINT runs_finished_iff_terminal CHECK (
        (status IN ('completed', 'failed', 'cancelled'))
        = (finished_at IS NOT NULL)
    ),
    ADD CONSTRAINT runs_wait_iff_waiting CHECK (
        (status = 'waiting') = (wait IS NOT NULL)
    ),
    ADD CONSTRAINT runs_wake_at_only_waiting CHECK (
        wake_at IS NULL OR status = 'waiting'
    ),
    ADD CONSTRAINT runs_payload_retention CHECK (
        payload_retention IN ('keep', 'drop_on_delivery')
    ),
    ADD CONSTRAINT runs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    ADD CONSTRAINT runs_attempt_count CHECK (attempt_count >= 0),
    ADD CONSTRAINT runs_started_has_attempt CHECK (
        status NOT IN ('running', 'waiting') OR attempt_count >= 1
    ),
    ADD CONSTRAINT runs_key_position_iff_key CHECK (
        (concurrency_key IS NULL) = (key_position IS NULL)
    ),
    ADD CONSTRAINT runs_key_held_only_queued CHECK (
        NOT key_held OR (concurrency_key IS NOT NULL AND status = 'queued')
    ),
    ADD CONSTRAINT runs_completed_has_result CHECK (
        status <> 'completed' OR result IS NOT NULL
    ),
    ADD CONSTRAINT runs_ledger_seq CHECK (ledger_seq >= 0);

ALTER TABLE attempts
    DROP CONSTRAINT attempts_rules,
    ADD CONSTRAINT attempts_attempt CHECK (attempt >= 1),
    ADD CONSTRAINT attempts_status CHECK (
        status IN (
            'running', 'completed', 'failed', 'cancelled', 'waiting', 'lost',
            'resumed', 'released'
        )
    ),
    ADD CONSTRAINT attempts_running_has_lease CHECK (
        status <> 'running' OR lease_expires_at IS NOT NULL
    ),
    ADD CONSTRAINT attempts_finished_iff_ended CHECK (
        (
            status IN (
                'completed', 'failed', 'cancelled', 'lost', 'resumed', 'released'
            )
        )
        = (finished_at IS NOT NULL)
    ),
    ADD CONSTRAINT attempts_waiting_has_wait CHECK (
        status <> 'waiting' OR wait IS NOT NULL
    ),
    ADD CONSTRAINT attempts_received_has_result CHECK (
        runner_result_received_at IS NULL OR runner_result IS NOT NULL
    ),
    -- What a fenced write that ended the live phase answered (SPEC §3.2):
    -- complete, fail / reap (retry_scheduled, failed), cancellation,
    -- suspend (waiting, or resumed when a stored signal woke it at once)
    -- and release_attempt.
    ADD CONSTRAINT attempts_outcome CHECK (
        outcome IN (
            'completed', 'retry_scheduled', 'failed', 'cancelled', 'waiting',
            'resumed', 'released'
        )
    ),
    ADD CONSTRAINT attempts_outcome_op CHECK ((outcome IS NULL) = (outcome_op IS NULL));

DROP FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint
);
DROP FUNCTION _attempts_rules(
    integer, text, timestamptz, timestamptz, jsonb, timestamptz, jsonb, text, text
);
