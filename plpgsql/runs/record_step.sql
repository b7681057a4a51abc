-- record_step(): checkpoint one step of a durable handler: its result is
-- stored under the step's name on the run, once, and every later claim of
-- the run returns it in `steps`, so a retried or resumed attempt skips the
-- work.
--
-- Locks: the run's key, its row, then the attempt row (custody steps 1-3), waiting
-- under the bounded lock wait; then, in fresh snapshots, the fence and the
-- cancel marker, as heartbeat does. Outcomes:
--   recorded          stored now (and, unless settings.step_events is off,
--                     a step.recorded event appended to the run's
--                     observability lane: {step, attempt});
--   already_recorded  a step of that name is stored: it stands (its result,
--                     not this one, is what claims return), nothing written;
--   cancelled         the run was cancelled: stop;
--   fence_lost        not the run's live attempt, or a wrong token.
-- A recorded step also clears the run's resume (below): the wake's news is
-- taken, by the step that waited for it.
-- Replay: the same call repeated after a lost reply (same attempt, token,
-- step and result) answers recorded again and writes nothing, whatever the
-- attempt's state now; a stale attempt's new step is fence_lost.
CREATE FUNCTION record_step(
    run_id text,
    attempt integer,
    lease_token uuid,
    step text,
    result jsonb
)
RETURNS text
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
    v_stored steps;
    v_outcome text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', record_step.run_id);
    PERFORM _check_token(record_step.attempt, record_step.lease_token);
    PERFORM _check_id('step', record_step.step);
    PERFORM _check_json('result', record_step.result);

    v_run := _lock_run(record_step.run_id);
    v_attempt := _lock_attempt(record_step.run_id, record_step.attempt);
    SELECT s.* INTO v_stored
    FROM steps AS s
    WHERE s.run_id = record_step.run_id AND s.step = record_step.step;
    -- A repeat of the call that stored it: the same answer, nothing written.
    IF
        v_stored.attempt = record_step.attempt
        AND v_attempt.lease_token = record_step.lease_token
        AND v_stored.result = record_step.result
    THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'recorded');
    END IF;
    v_outcome := _fence(v_run, v_attempt, record_step.lease_token, 'record_step');
    IF v_outcome IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, v_outcome);
    END IF;
    IF _apply_marker(v_run) THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'cancelled');
    END IF;
    IF v_stored.run_id IS NOT NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'already_recorded');
    END IF;

    -- A woken run's resume (what the wake delivered) is taken by the first
    -- step its attempt records, the one that waited (durable waits record
    -- the resume under their step's name): cleared here, so that an attempt
    -- after a crash does not take it for the wake of a later wait.
    IF v_run.resume IS NOT NULL THEN
        UPDATE runs AS r SET resume = NULL WHERE r.run_id = record_step.run_id;
    END IF;
    INSERT INTO steps (run_id, step, position, result, attempt, recorded_at)
    SELECT
        record_step.run_id, record_step.step,
        coalesce((
            SELECT max(s.position) FROM steps AS s
            WHERE s.run_id = record_step.run_id
        ), 0) + 1,
        record_step.result, record_step.attempt, _now();
    IF (SELECT s.step_events FROM settings AS s) THEN
        PERFORM _append(record_step.run_id, jsonb_build_array(jsonb_build_object(
            'type', 'step.recorded',
            'payload', jsonb_build_object('step', record_step.step, 'attempt', record_step.attempt),
            'lane', 'observability',
            'delivery_key', NULL,
            'transport_only', FALSE
        )));
    END IF;
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'recorded');
END;
$$;

COMMENT ON FUNCTION record_step(text, integer, uuid, text, jsonb) IS
'Records a step''s result on the run from its live attempt: recorded, already_recorded (the stored one stands), cancelled or fence_lost.';
