-- Revision 0008, the row rules of runs and attempts: each table's CHECK
-- constraints become one CHECK that calls the table's rules function
-- (_runs_rules, _attempts_rules; see plpgsql/schema/02_runs.sql). The rules and
-- their names are unchanged: a row that breaks one fails as before, with
-- SQLSTATE 23514 and the rule's name. The cause is cost: PostgreSQL 15 rebuilds
-- every CHECK expression of a table for each statement that writes it.
--
-- The functions are state, not code: the constraints depend on them, so
-- drop_code keeps them and only this file and downgrade.sql change them.
--
-- The new constraints are added valid (one scan of each table inside the
-- migration's transaction): they enforce exactly the rules the dropped
-- constraints enforced on every row any earlier revision wrote, so every
-- existing row passes.
CREATE FUNCTION _runs_rules(
    p_run_id text,
    p_queue text,
    p_status text,
    p_finished_at timestamptz,
    p_wait jsonb,
    p_wake_at timestamptz,
    p_payload_retention text,
    p_max_attempts integer,
    p_attempt_count integer,
    p_concurrency_key text,
    p_key_position bigint,
    p_key_held boolean,
    p_result jsonb,
    p_ledger_seq bigint
)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT (p_attempt_count >= 0) THEN 'runs_attempt_count'
        WHEN NOT (p_status <> 'completed' OR p_result IS NOT NULL)
            THEN 'runs_completed_has_result'
        WHEN NOT (
            (p_status IN ('completed', 'failed', 'cancelled'))
            = (p_finished_at IS NOT NULL)
        ) THEN 'runs_finished_iff_terminal'
        WHEN NOT (
            NOT p_key_held OR (p_concurrency_key IS NOT NULL AND p_status = 'queued')
        ) THEN 'runs_key_held_only_queued'
        WHEN NOT ((p_concurrency_key IS NULL) = (p_key_position IS NULL))
            THEN 'runs_key_position_iff_key'
        WHEN NOT (p_ledger_seq >= 0) THEN 'runs_ledger_seq'
        WHEN NOT (p_max_attempts BETWEEN 1 AND 1000) THEN 'runs_max_attempts'
        WHEN NOT (p_payload_retention IN ('keep', 'drop_on_delivery'))
            THEN 'runs_payload_retention'
        WHEN NOT (length(p_queue) BETWEEN 1 AND 200) THEN 'runs_queue_length'
        WHEN NOT (length(p_run_id) BETWEEN 1 AND 200) THEN 'runs_run_id_length'
        WHEN NOT (p_status NOT IN ('running', 'waiting') OR p_attempt_count >= 1)
            THEN 'runs_started_has_attempt'
        WHEN NOT (
            p_status IN (
                'queued', 'running', 'waiting', 'completed', 'failed', 'cancelled'
            )
        ) THEN 'runs_status'
        WHEN NOT ((p_status = 'waiting') = (p_wait IS NOT NULL))
            THEN 'runs_wait_iff_waiting'
        WHEN NOT (p_wake_at IS NULL OR p_status = 'waiting')
            THEN 'runs_wake_at_only_waiting'
    END;
    IF v_broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'runs';
END;
$$;

COMMENT ON FUNCTION _runs_rules(
    text, text, text, timestamptz, jsonb, timestamptz, text, integer, integer,
    text, bigint, boolean, jsonb, bigint
) IS
'The row rules of runs (the runs_rules CHECK): true, or a 23514 error naming the rule the row breaks.';

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
SET search_path FROM CURRENT
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

ALTER TABLE runs
    DROP CONSTRAINT runs_run_id_length,
    DROP CONSTRAINT runs_queue_length,
    DROP CONSTRAINT runs_status,
    DROP CONSTRAINT runs_finished_iff_terminal,
    DROP CONSTRAINT runs_wait_iff_waiting,
    DROP CONSTRAINT runs_wake_at_only_waiting,
    DROP CONSTRAINT runs_payload_retention,
    DROP CONSTRAINT runs_max_attempts,
    DROP CONSTRAINT runs_attempt_count,
    DROP CONSTRAINT runs_started_has_attempt,
    DROP CONSTRAINT runs_key_position_iff_key,
    DROP CONSTRAINT runs_key_held_only_queued,
    DROP CONSTRAINT runs_completed_has_result,
    DROP CONSTRAINT runs_ledger_seq,
    ADD CONSTRAINT runs_rules CHECK (
        _runs_rules(
            run_id, queue, status, finished_at, wait, wake_at, payload_retention,
            max_attempts, attempt_count, concurrency_key, key_position, key_held,
            result, ledger_seq
        )
    );

ALTER TABLE attempts
    DROP CONSTRAINT attempts_attempt,
    DROP CONSTRAINT attempts_status,
    DROP CONSTRAINT attempts_running_has_lease,
    DROP CONSTRAINT attempts_finished_iff_ended,
    DROP CONSTRAINT attempts_waiting_has_wait,
    DROP CONSTRAINT attempts_received_has_result,
    DROP CONSTRAINT attempts_outcome,
    DROP CONSTRAINT attempts_outcome_op,
    ADD CONSTRAINT attempts_rules CHECK (
        _attempts_rules(
            attempt, status, lease_expires_at, finished_at, wait,
            runner_result_received_at, runner_result, outcome, outcome_op
        )
    );
