-- ledger_next_due_at(): the earliest moment any claimable ledger work exists,
-- for a relay deciding how long to sleep. A live lease counts as due at its
-- expiry; a blocked lane is not due (a transport-only head is, like any); a
-- lane drained while a writer held its run row is due at its re-check (see
-- _refresh_lane); a lane with a wake-up (append.sql) is due at once; NULL
-- when nothing is pending. Reads ledger_lanes (one row
-- per run lane) through ledger_lanes_available_idx: an index seek per lane,
-- whatever the number of pending events or runs. No locks.
CREATE FUNCTION ledger_next_due_at(lane text DEFAULT NULL, run_id text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_lane text;
    v_due timestamptz;
    v_best timestamptz;
BEGIN
    PERFORM _require_read_committed();
    IF ledger_next_due_at.lane IS NOT NULL THEN
        PERFORM _check_lane(ledger_next_due_at.lane);
    END IF;
    PERFORM _check_id('run_id', ledger_next_due_at.run_id, TRUE);
    IF ledger_next_due_at.run_id IS NOT NULL THEN
        SELECT min(ll.available_at) INTO v_best
        FROM ledger_lanes AS ll
        WHERE
            ll.run_id = ledger_next_due_at.run_id
            AND (ledger_next_due_at.lane IS NULL OR ll.lane = ledger_next_due_at.lane);
        SELECT least(v_best, min(w.created_at)) INTO v_best
        FROM ledger_wakeups AS w
        WHERE
            w.run_id = ledger_next_due_at.run_id
            AND (ledger_next_due_at.lane IS NULL OR w.lane = ledger_next_due_at.lane);
        RETURN v_best;
    END IF;
    FOREACH v_lane IN ARRAY CASE
        WHEN ledger_next_due_at.lane IS NULL THEN ARRAY['lifecycle', 'observability']
        ELSE ARRAY[ledger_next_due_at.lane]
    END LOOP
        SELECT ll.available_at INTO v_due
        FROM ledger_lanes AS ll
        WHERE ll.lane = v_lane AND ll.available_at IS NOT NULL
        ORDER BY ll.available_at
        LIMIT 1;
        v_best := least(v_best, v_due);
        -- A wake-up is due from its creation (see append.sql).
        SELECT w.created_at INTO v_due
        FROM ledger_wakeups AS w
        WHERE w.lane = v_lane
        ORDER BY w.created_at
        LIMIT 1;
        v_best := least(v_best, v_due);
    END LOOP;
    RETURN v_best;
END;
$$;

COMMENT ON FUNCTION ledger_next_due_at(text, text) IS
'The earliest moment claimable ledger work exists (a live lease counts at its expiry); null when nothing is pending.';
