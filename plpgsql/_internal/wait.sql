-- Wait kinds: why a suspended run is not runnable (SPEC: sleep, event,
-- detached_runner). Every fact that differs between kinds lives in
-- _wait_kinds() below, and every other function asks the helpers of this file
-- instead of comparing kind strings — so adding a kind is one row there (and,
-- for the Python client, a constructor of runrelay.worker.Suspend).

-- PL/pgSQL throughout, not SQL: a SQL function with a SET clause is never
-- inlined and is planned again on every call (custody.sql); these run on
-- every suspension, signal and wake.

-- _wait_kinds(): the table of wait kinds, one row per kind.
--   name_key          the field naming what is awaited (a string id), if any
--   deadline_key      the field holding the moment the wait ends by itself
--   deadline_required whether that field must be given
--   signal_resumes    a signal_run whose name equals the name_key field
--                     resumes the wait (and a stored one is consumed at once)
--   detached          an external runner pushes the outcome
--                     (record_runner_terminal, claim_detached_terminal); its
--                     run.waiting/run.resumed are transport-only, and a worker
--                     cannot fail the wait (prepare_waiting_failure)
--   timeout_resume    the resume of a wait that ended by its deadline
-- The fields a wait may carry are kind, name_key and deadline_key.
CREATE FUNCTION _wait_kinds()
RETURNS TABLE (
    kind text,
    name_key text,
    deadline_key text,
    deadline_required boolean,
    signal_resumes boolean,
    detached boolean,
    timeout_resume jsonb
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY VALUES
    ('sleep', NULL, 'until', TRUE, FALSE, FALSE, '{"slept": true}'::jsonb),
    ('event', 'name', 'timeout_at', FALSE, TRUE, FALSE, '{"timed_out": true}'::jsonb),
    ('detached_runner', 'runner', 'timeout_at', FALSE, FALSE, TRUE, '{"timed_out": true}'::jsonb);
END;
$$;

COMMENT ON FUNCTION _wait_kinds() IS
'The wait kinds and their facts: name and deadline fields, whether a signal resumes it, whether it is detached, its timeout resume.';

-- _wait_kind(): the row of _wait_kinds() for a wait (NULL fields for a null
-- wait or an unknown kind).
CREATE FUNCTION _wait_kind(
    p_wait jsonb,
    OUT kind text,
    OUT name_key text,
    OUT deadline_key text,
    OUT deadline_required boolean,
    OUT signal_resumes boolean,
    OUT detached boolean,
    OUT timeout_resume jsonb
)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    SELECT k.kind, k.name_key, k.deadline_key, k.deadline_required, k.signal_resumes, k.detached, k.timeout_resume
    INTO kind, name_key, deadline_key, deadline_required, signal_resumes, detached, timeout_resume
    FROM _wait_kinds() AS k
    WHERE k.kind = p_wait ->> 'kind';
END;
$$;

COMMENT ON FUNCTION _wait_kind(jsonb) IS
'The _wait_kinds() row of a wait''s kind (all NULL for a null wait or an unknown kind).';

-- _wait_detached(): the wait is a detached runner's (false for a null wait).
CREATE FUNCTION _wait_detached(p_wait jsonb)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN coalesce((_wait_kind(p_wait)).detached, FALSE);
END;
$$;

COMMENT ON FUNCTION _wait_detached(jsonb) IS
'True iff the wait is a detached runner''s: its outcome is pushed by the runner, its events are transport-only.';

-- _wait_signal_name(): the signal name that resumes the wait, NULL when no
-- signal resumes it.
CREATE FUNCTION _wait_signal_name(p_wait jsonb)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_kind record := _wait_kind(p_wait);
BEGIN
    RETURN CASE WHEN v_kind.signal_resumes THEN p_wait ->> v_kind.name_key END;
END;
$$;

COMMENT ON FUNCTION _wait_signal_name(jsonb) IS
'The name of the signal that resumes the wait, or NULL if no signal resumes it.';

-- _wait_deadline(): when the wait ends by itself, from its own fields (NULL:
-- never). See _wake_at for the deadline the scheduler applies.
CREATE FUNCTION _wait_deadline(p_wait jsonb)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (p_wait ->> (_wait_kind(p_wait)).deadline_key)::timestamptz;
END;
$$;

COMMENT ON FUNCTION _wait_deadline(jsonb) IS
'The moment a wait ends by itself according to its own fields (until / timeout_at), NULL for never.';

-- _wait_hint(): the HINT of a bad wait, every shape the table allows:
-- 'Pass {"kind":"sleep","until":ts}, {"kind":"event","name":n,"timeout_at":ts?} or ...'.
CREATE FUNCTION _wait_hint()
RETURNS text
LANGUAGE sql
VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT 'Pass ' || array_to_string(s.shapes[1:cardinality(s.shapes) - 1], ', ')
        || ' or ' || s.shapes[cardinality(s.shapes)] || '.'
    FROM (
        SELECT array_agg(
            format('{"kind":"%s"%s,"%s":ts%s}', k.kind,
                CASE WHEN k.name_key IS NOT NULL THEN format(',"%s":%s', k.name_key, left(k.name_key, 1)) ELSE '' END,
                k.deadline_key, CASE WHEN k.deadline_required THEN '' ELSE '?' END)
            ORDER BY k.ord
        ) AS shapes
        FROM _wait_kinds() WITH ORDINALITY AS k (
            kind, name_key, deadline_key, deadline_required, signal_resumes, detached, timeout_resume, ord
        )
    ) AS s;
$$;

COMMENT ON FUNCTION _wait_hint() IS
'The HINT of a rejected wait: every wait shape _wait_kinds() allows.';

-- _normalize_wait(): validates suspend_attempt's wait against its kind's
-- row of _wait_kinds() and returns it in canonical form (timestamps
-- normalised), so that "the very same suspension" can be compared with plain
-- jsonb equality.
CREATE FUNCTION _normalize_wait(p_wait jsonb)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_kind record;
    v_time timestamptz;
    v_out jsonb;
BEGIN
    PERFORM _check_json('wait', p_wait, 'object');
    SELECT k.* INTO v_kind FROM _wait_kind(p_wait) AS k;
    IF v_kind.kind IS NULL THEN
        PERFORM _invalid('wait', format('unknown kind %s', _quote((p_wait -> 'kind')::text)), _wait_hint());
    END IF;
    IF EXISTS (
        SELECT 1 FROM jsonb_object_keys(p_wait) AS k (name)
        WHERE k.name NOT IN ('kind', v_kind.deadline_key) AND k.name IS DISTINCT FROM v_kind.name_key
    ) THEN
        PERFORM _invalid('wait', format('unknown field for a %s wait', v_kind.kind), _wait_hint());
    END IF;
    v_out := jsonb_build_object('kind', v_kind.kind);
    IF v_kind.name_key IS NOT NULL THEN
        IF jsonb_typeof(p_wait -> v_kind.name_key) IS DISTINCT FROM 'string' THEN
            PERFORM _invalid('wait', format('a %s wait needs %s: a string', v_kind.kind, v_kind.name_key), _wait_hint());
        END IF;
        PERFORM _check_id('wait', p_wait ->> v_kind.name_key);
        v_out := v_out || jsonb_build_object(v_kind.name_key, p_wait ->> v_kind.name_key);
    END IF;
    IF p_wait ? v_kind.deadline_key AND jsonb_typeof(p_wait -> v_kind.deadline_key) <> 'null' THEN
        BEGIN
            v_time := (p_wait ->> v_kind.deadline_key)::timestamptz;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_text_representation THEN
            PERFORM _invalid('wait', format('%s is not a timestamp: %s', v_kind.deadline_key, _quote(p_wait ->> v_kind.deadline_key)), _wait_hint());
        END;
        IF jsonb_typeof(p_wait -> v_kind.deadline_key) <> 'string' OR NOT isfinite(v_time) THEN
            PERFORM _invalid('wait', format('%s must be a finite timestamp string', v_kind.deadline_key), _wait_hint());
        END IF;
        v_out := v_out || jsonb_build_object(v_kind.deadline_key, v_time);
    ELSIF v_kind.deadline_required THEN
        PERFORM _invalid('wait', format('a %s wait needs %s', v_kind.kind, v_kind.deadline_key), _wait_hint());
    END IF;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION _normalize_wait(jsonb) IS
'Validates a wait object and returns it canonicalised (kind, name/runner, until/timeout_at).';

-- _wake_at(): when a wait ends by itself — runs.wake_at, the deadline that
-- claims (_end_due_waits), signal_run and the time checks of the fenced writes all
-- read. A sleep ends at its until; an event or detached_runner wait at its
-- timeout_at (never, without one). Once a detached runner has pushed its
-- terminal (p_received_at), the owner must claim it within the claim window,
-- 5 minutes, and never after the wait's timeout_at: the earlier of the two
-- ends the wait. Without that bound a terminal its owner never claims (the
-- owner died, or lost the token) would keep the run waiting forever; past it,
-- the next claim on the run's queue wakes the run like any due wait, and the
-- next attempt's resume carries the pushed result (see _timeout_resume).
CREATE FUNCTION _wake_at(p_wait jsonb, p_received_at timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_claim_window constant interval := interval '5 minutes';
    v_deadline timestamptz := _wait_deadline(p_wait);
BEGIN
    IF _wait_detached(p_wait) AND p_received_at IS NOT NULL THEN
        -- least() ignores a null: without timeout_at, the window alone bounds it.
        RETURN least(v_deadline, p_received_at + v_claim_window);
    END IF;
    RETURN v_deadline;
END;
$$;

COMMENT ON FUNCTION _wake_at(jsonb, timestamptz) IS
'When a wait ends by itself: until / timeout_at; a pushed detached terminal also within a 5-minute claim window.';

-- _suspension_in_force(): the attempt's suspension is the one its run is in —
-- the rule prepare_waiting_failure and fail_attempt(...,
-- protect_waiting_suspension => true) share. True iff the run waits, on a wait
-- that is not a detached runner's; the attempt is the run's current attempt;
-- it recorded that very wait; and its receipt is still
-- {"status": "suspended", "wait": <that wait>}. A detached runner's wait never
-- qualifies: its outcome belongs to the runner (record_runner_terminal
-- replaces the receipt with the pushed terminal) and it ends through
-- claim_detached_terminal, so a protected failure must not overwrite it.
-- Time is the caller's to check (a wait past wake_at has ended). Reads only
-- its arguments: the caller passes rows read under the custody locks.
CREATE FUNCTION _suspension_in_force(p_run runs, p_attempt attempts)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN coalesce(
        p_run.status = 'waiting'
        AND NOT _wait_detached(p_run.wait)
        AND p_attempt.run_id = p_run.run_id
        AND p_attempt.attempt = p_run.attempt_count
        AND p_attempt.wait = p_run.wait
        AND p_attempt.runner_result = jsonb_build_object('status', 'suspended', 'wait', p_run.wait),
        FALSE
    );
END;
$$;

COMMENT ON FUNCTION _suspension_in_force(runs, attempts) IS
'True iff the attempt''s recorded suspension (wait and receipt) is the non-detached wait its run is in.';

-- _timeout_resume(): what a wait that ended by time delivers to the next
-- attempt: its kind's timeout resume. A detached runner's wait that ended
-- with a pushed terminal nobody claimed (its claim window passed, see
-- _wake_at) also carries that terminal, so the next attempt can write it
-- instead of running the work again. Called under the
-- run's lock, which every writer of runner_result holds too.
CREATE FUNCTION _timeout_resume(p_run runs)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_kind record := _wait_kind(p_run.wait);
    v_pushed jsonb;
BEGIN
    IF v_kind.detached THEN
        SELECT a.runner_result INTO v_pushed
        FROM attempts AS a
        WHERE
            a.run_id = p_run.run_id
            AND a.attempt = p_run.attempt_count
            AND a.runner_result_received_at IS NOT NULL;
        IF FOUND THEN
            RETURN v_kind.timeout_resume || jsonb_build_object('runner_result', v_pushed);
        END IF;
    END IF;
    RETURN v_kind.timeout_resume;
END;
$$;

COMMENT ON FUNCTION _timeout_resume(runs) IS
'The resume of a wait that ended by time: {"slept": true}, else {"timed_out": true} (+ runner_result if one was pushed).';
