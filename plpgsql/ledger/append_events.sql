-- append_events(): append events to the end of a run's ledger.
--
-- events: [{type, payload?, lane?, delivery_key?, transport_only?}, ...], at
-- most 1000; lane defaults to lifecycle, the delivery key to <run_id>:<seq>.
-- Locks the run row (custody step 2), so concurrent appends to one run get
-- distinct, increasing seq in commit order; called in a producer's
-- transaction, the events commit (and become claimable) with its writes.
-- Appending to an ended run is allowed (compensations, late facts). An
-- unknown run raises 22023, and so does an event type starting run. or
-- step. (the engine's events, _event_type_reserved; final_events of the
-- workers' calls follow the same rule).
-- Replay: with explicit delivery keys on every event, repeating a call that
-- committed returns the events it appended and appends nothing; a reused key
-- with different content raises 22023. Without keys an append cannot be told
-- from a new one: pass delivery keys when a lost reply may be retried.
CREATE FUNCTION append_events(run_id text, events jsonb)
RETURNS SETOF append_result
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
    v_events jsonb;
    v_found text;
    v_count integer;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', append_events.run_id);
    PERFORM _check_json('events', append_events.events, 'array');
    SELECT r.run_id INTO v_found FROM runs AS r WHERE r.run_id = append_events.run_id FOR NO KEY UPDATE;
    IF v_found IS NULL THEN
        PERFORM _invalid('run_id', format('no run %s', _quote(append_events.run_id)),
            'Enqueue the run first (enqueue_run), in the same transaction if need be.');
    END IF;

    -- Exact replay: when every event names its delivery key and each already
    -- exists on this run with the same type, lane, flag and payload (or a
    -- payload since dropped on delivery), this is a repeat of a call that
    -- committed: answer what it answered. Checked under the run lock, so two
    -- concurrent identical calls resolve to one append and one replay.
    v_count := jsonb_array_length(append_events.events);
    IF v_count > 0 AND v_count = (
        SELECT count(*)
        FROM jsonb_array_elements(append_events.events) AS e (value)
        INNER JOIN ledger_events AS l
            ON
                jsonb_typeof(e.value) = 'object'
                AND l.delivery_key = e.value ->> 'delivery_key'
                -- explicit keys only, as the unique index holds them: a
                -- default key (<run_id>:<seq>) is never passed explicitly
                AND l.delivery_key <> l.run_id || ':' || l.seq::text
                AND l.run_id = append_events.run_id
                AND l.type = e.value ->> 'type'
                AND l.lane = coalesce(e.value ->> 'lane', 'lifecycle')
                AND to_jsonb(l.transport_only) = coalesce(e.value -> 'transport_only', 'false'::jsonb)
                AND (l.payload IS NULL OR l.payload = coalesce(e.value -> 'payload', '{}'::jsonb))
    ) THEN
        RETURN QUERY
        SELECT l.event_id, l.seq, l.delivery_key
        FROM jsonb_array_elements(append_events.events) WITH ORDINALITY AS e (value, ordinality)
        INNER JOIN ledger_events AS l
            ON
                l.delivery_key = e.value ->> 'delivery_key'
                AND l.delivery_key <> l.run_id || ':' || l.seq::text
        ORDER BY e.ordinality;
        PERFORM _restore_lock_wait(v_caller_lock_timeout);
        RETURN;
    END IF;

    v_events := _normalize_events('events', append_events.events);
    RETURN QUERY SELECT a.event_id, a.seq, a.delivery_key FROM _append(append_events.run_id, v_events) AS a;
    PERFORM _restore_lock_wait(v_caller_lock_timeout);
END;
$$;

COMMENT ON FUNCTION append_events(text, jsonb) IS
'Appends events to the end of a run''s ledger (per-run seq in commit order); returns event_id, seq, delivery_key.';
