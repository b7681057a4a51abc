-- skip_ledger_events(): an operator ends a lane's blocked head without
-- delivering it, so that the lane delivers its successors.
--
-- A lane is blocked when its head failed permanently (fail_ledger with
-- permanent, or too many attempts): nothing after it is delivered until an
-- operator acts. requeue_ledger_event retries the head; this gives it up:
-- the failed head becomes skipped, a terminal state beside delivered (the
-- event counts as done for the lane's order and for prune), keeping
-- skip_reason and the session's role (skipped_by). Outcomes, one row:
--   skipped      (event_id, seq of the head it skipped);
--   not_blocked  the lane's head (or nulls for an empty or unknown lane) is
--                not failed: nothing changed.
-- Replay: with call_id, a repeat answers the first reply and writes nothing:
-- skipped from the event, which keeps the call's id; not_blocked from the
-- calls row, which keeps the head it found (a head that failed since is not
-- skipped by a repeat: the operator decided on what the first call saw).
--
-- Locks: the call_id's lock (if any), then the lane row (the one lane lock
-- order, _lock_event_lanes), waiting at most the bounded lock wait.
CREATE FUNCTION skip_ledger_events(
    run_id text,
    lane text,
    reason text,
    call_id uuid DEFAULT NULL
)
RETURNS TABLE (event_id bigint, seq bigint, outcome text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_digest bytea;
    v_recorded text;
    v_reply jsonb;
    v_head ledger_events;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', skip_ledger_events.run_id);
    PERFORM _check_lane(skip_ledger_events.lane);
    PERFORM _check_reason('reason', skip_ledger_events.reason);
    PERFORM _check_call_id(skip_ledger_events.call_id);

    IF skip_ledger_events.call_id IS NOT NULL THEN
        v_digest := _call_digest(jsonb_build_array(skip_ledger_events.lane, skip_ledger_events.reason));
        v_recorded := _recorded_call(
            skip_ledger_events.call_id, 'skip_ledger_events', skip_ledger_events.run_id, v_digest
        );
        IF v_recorded = 'skipped' THEN
            RETURN QUERY
            SELECT l.event_id, l.seq, 'skipped'::text
            FROM ledger_events AS l
            WHERE
                l.run_id = skip_ledger_events.run_id AND l.lane = skip_ledger_events.lane
                AND l.skip_call_id = skip_ledger_events.call_id;
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        ELSIF v_recorded = 'not_blocked' THEN
            SELECT c.reply INTO v_reply FROM calls AS c WHERE c.call_id = skip_ledger_events.call_id;
            RETURN QUERY SELECT (v_reply ->> 'event_id')::bigint, (v_reply ->> 'seq')::bigint, 'not_blocked'::text;
            PERFORM _restore_lock_wait(v_caller_lock_timeout);
            RETURN;
        END IF;
    END IF;

    PERFORM 1 FROM ledger_lanes AS ll
    WHERE ll.run_id = skip_ledger_events.run_id AND ll.lane = skip_ledger_events.lane
    FOR UPDATE;
    -- The head: the lane's first event not done, from its recorded head.
    SELECT l.* INTO v_head
    FROM ledger_events AS l
    WHERE
        l.run_id = skip_ledger_events.run_id AND l.lane = skip_ledger_events.lane
        AND l.seq >= coalesce((
            SELECT coalesce(ll.head_seq, ll.delivered_below) FROM ledger_lanes AS ll
            WHERE ll.run_id = skip_ledger_events.run_id AND ll.lane = skip_ledger_events.lane
        ), 0)
        AND l.delivered_at IS NULL
    ORDER BY l.seq
    LIMIT 1;
    IF v_head.event_id IS NULL OR v_head.failed_at IS NULL THEN
        PERFORM _record_call(
            skip_ledger_events.call_id, 'skip_ledger_events', skip_ledger_events.run_id, v_digest, 'not_blocked',
            jsonb_build_object('event_id', v_head.event_id, 'seq', v_head.seq)
        );
        RETURN QUERY SELECT v_head.event_id, v_head.seq, 'not_blocked'::text;
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;

    UPDATE ledger_events AS l
    SET delivered_at = _now(),
        delivered_by = session_user,
        failed_at = NULL,
        skipped_at = _now(),
        skip_reason = skip_ledger_events.reason,
        skipped_by = session_user,
        skip_call_id = skip_ledger_events.call_id
    WHERE l.event_id = v_head.event_id;
    PERFORM _record_call(
        skip_ledger_events.call_id, 'skip_ledger_events', skip_ledger_events.run_id, v_digest, 'skipped'
    );
    -- The head moves past it; its successors become claimable (and relays
    -- are woken).
    PERFORM _refresh_lane(skip_ledger_events.run_id, skip_ledger_events.lane);
    PERFORM pg_notify(n.channel, skip_ledger_events.run_id) FROM _notifying('ledger') AS n (channel);
    RETURN QUERY SELECT v_head.event_id, v_head.seq, 'skipped'::text;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION skip_ledger_events(text, text, text, uuid) IS
'Ends a lane''s blocked head (a failed event) as skipped, so the lane delivers its successors: skipped or not_blocked.';
