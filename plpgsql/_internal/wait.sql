-- _normalize_wait(): validates suspend_attempt's wait and returns it in
-- canonical form (timestamps normalised), so that "the very same
-- suspension" can be compared with plain jsonb equality.
CREATE FUNCTION _normalize_wait(p_wait jsonb)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hint constant text :=
        'Pass {"kind":"sleep","until":ts}, {"kind":"event","name":n,"timeout_at":ts?} '
        'or {"kind":"detached_runner","runner":r,"timeout_at":ts?}.';
    v_kind text;
    v_allowed text[];
    v_time_key text;
    v_name_key text;
    v_time timestamptz;
    v_out jsonb;
BEGIN
    PERFORM _check_json('wait', p_wait, 'object');
    v_kind := p_wait ->> 'kind';
    CASE v_kind
        WHEN 'sleep' THEN v_allowed := ARRAY['kind', 'until']; v_time_key := 'until';
        WHEN 'event' THEN v_allowed := ARRAY['kind', 'name', 'timeout_at']; v_time_key := 'timeout_at'; v_name_key := 'name';
        WHEN 'detached_runner' THEN v_allowed := ARRAY['kind', 'runner', 'timeout_at']; v_time_key := 'timeout_at'; v_name_key := 'runner';
        ELSE
            PERFORM _invalid('wait', format('unknown kind %s', coalesce(p_wait -> 'kind', 'null'::jsonb)), v_hint);
    END CASE;
    IF EXISTS (SELECT 1 FROM jsonb_object_keys(p_wait) AS k (name) WHERE k.name <> ALL(v_allowed)) THEN
        PERFORM _invalid('wait', format('unknown field for a %s wait', v_kind), v_hint);
    END IF;
    v_out := jsonb_build_object('kind', v_kind);
    IF v_name_key IS NOT NULL THEN
        IF jsonb_typeof(p_wait -> v_name_key) IS DISTINCT FROM 'string' THEN
            PERFORM _invalid('wait', format('a %s wait needs %s: a string', v_kind, v_name_key), v_hint);
        END IF;
        PERFORM _check_id('wait', p_wait ->> v_name_key);
        v_out := v_out || jsonb_build_object(v_name_key, p_wait ->> v_name_key);
    END IF;
    IF p_wait ? v_time_key AND jsonb_typeof(p_wait -> v_time_key) <> 'null' THEN
        BEGIN
            v_time := (p_wait ->> v_time_key)::timestamptz;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_text_representation THEN
            PERFORM _invalid('wait', format('%s is not a timestamp: %s', v_time_key, p_wait -> v_time_key), v_hint);
        END;
        IF jsonb_typeof(p_wait -> v_time_key) <> 'string' OR NOT isfinite(v_time) THEN
            PERFORM _invalid('wait', format('%s must be a finite timestamp string', v_time_key), v_hint);
        END IF;
        v_out := v_out || jsonb_build_object(v_time_key, v_time);
    ELSIF v_kind = 'sleep' THEN
        PERFORM _invalid('wait', 'a sleep wait needs until', v_hint);
    END IF;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION _normalize_wait(jsonb) IS
'Validates a wait object and returns it canonicalised (kind, name/runner, until/timeout_at).';

-- _wake_at(): when a wait ends by itself — runs.wake_at, the deadline that
-- claims (_wake_due), signal_run and the time checks of the fenced writes all
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
    v_deadline timestamptz := coalesce(p_wait ->> 'until', p_wait ->> 'timeout_at')::timestamptz;
BEGIN
    IF p_wait ->> 'kind' = 'detached_runner' AND p_received_at IS NOT NULL THEN
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
        AND p_run.wait ->> 'kind' <> 'detached_runner'
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
