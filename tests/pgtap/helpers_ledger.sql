-- Fixtures for the run ledger tests (030-040), loaded after helpers.sql into
-- the `tests` schema. Every fixture goes through the public API and raises
-- when the API did not do what the fixture needs, so a broken fixture cannot
-- make an assertion pass by accident.

-- A run whose lifecycle lane starts empty: enqueue it (which appends
-- run.queued at seq 1) on a queue named after it, then have relay 'fixture'
-- claim and acknowledge that run.queued event.
CREATE FUNCTION tests.ledger_run(p_run_id text, p_retention text DEFAULT 'keep')
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_event_id bigint;
    v_acked bigint;
BEGIN
    PERFORM runrelay.enqueue_run(run_id => p_run_id, queue => p_run_id, payload_retention => p_retention);
    SELECT c.event_id INTO v_event_id
    FROM runrelay.claim_ledger(relay => 'fixture', run_id => p_run_id) AS c
    WHERE c.kind = 'claimed' AND c.type = 'run.queued';
    IF v_event_id IS NULL THEN
        RAISE EXCEPTION 'tests.ledger_run: run.queued of % was not claimed', p_run_id;
    END IF;
    SELECT a.event_id INTO v_acked
    FROM runrelay.ack_ledger(relay => 'fixture', run_id => p_run_id, event_ids => ARRAY[v_event_id]) AS a
    WHERE a.kind = 'delivered';
    IF v_acked IS DISTINCT FROM v_event_id THEN
        RAISE EXCEPTION 'tests.ledger_run: run.queued of % was not acknowledged', p_run_id;
    END IF;
END;
$$;

-- Append one event per type to a run's lane; returns their event_ids in
-- order. p_transport_only marks every appended event transport-only.
CREATE FUNCTION tests.append(
    p_run_id text,
    p_types text[],
    p_lane text DEFAULT 'lifecycle',
    p_transport_only boolean DEFAULT FALSE
)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids bigint [];
BEGIN
    SELECT array_agg(a.event_id ORDER BY a.seq) INTO v_ids
    FROM runrelay.append_events(
        p_run_id,
        (
            SELECT jsonb_agg(
                jsonb_build_object(
                    'type', t.type, 'lane', p_lane, 'transport_only', p_transport_only,
                    'payload', jsonb_build_object('n', t.n)
                )
                ORDER BY t.n
            )
            FROM unnest(p_types) WITH ORDINALITY AS t (type, n)
        )
    ) AS a;
    IF coalesce(cardinality(v_ids), 0) <> cardinality(p_types) THEN
        RAISE EXCEPTION 'tests.append: % events appended to %, expected %',
            coalesce(cardinality(v_ids), 0), p_run_id, cardinality(p_types);
    END IF;
    RETURN v_ids;
END;
$$;

-- The event_id of a run's event of a given type (types are unique per run in
-- these tests; raises otherwise).
CREATE FUNCTION tests.eid(p_run_id text, p_type text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids bigint [];
BEGIN
    SELECT array_agg(l.event_id) INTO v_ids
    FROM runrelay.ledger AS l
    WHERE l.run_id = p_run_id AND l.type = p_type;
    IF coalesce(cardinality(v_ids), 0) <> 1 THEN
        RAISE EXCEPTION 'tests.eid: % events of type % in run %', coalesce(cardinality(v_ids), 0), p_type, p_run_id;
    END IF;
    RETURN v_ids[1];
END;
$$;

-- The event_ids of a run's events of the given types, in the order given.
CREATE FUNCTION tests.eids(p_run_id text, p_types text[])
RETURNS bigint[]
LANGUAGE sql
AS $$
    SELECT array_agg(tests.eid(p_run_id, t.type) ORDER BY t.n)
    FROM unnest(p_types) WITH ORDINALITY AS t (type, n);
$$;

-- One event's delivery state, e.g. 'leased:r1', 'pending', 'delivered:r1',
-- 'failed'.
CREATE FUNCTION tests.ev_state(p_event_id bigint)
RETURNS text
LANGUAGE sql
AS $$
    SELECT l.state || coalesce(':' || coalesce(l.lease_owner, l.delivered_by), '')
    FROM runrelay.ledger AS l
    WHERE l.event_id = p_event_id;
$$;

-- A run's events (both lanes) as 'type=state' in seq order, for compact
-- assertions on a whole run.
CREATE FUNCTION tests.ledger_states(p_run_id text)
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT coalesce(array_agg(l.type || '=' || tests.ev_state(l.event_id) ORDER BY l.seq), '{}'::text [])
    FROM runrelay.ledger AS l
    WHERE l.run_id = p_run_id;
$$;

-- Remove every run (cascading to the ledger) inside the test transaction, so
-- that assertions on whole-installation answers (ledger_next_due_at without
-- run_id, the stats views) do not depend on what else the database holds.
CREATE FUNCTION tests.clear_runs()
RETURNS void
LANGUAGE sql
AS $$
    DELETE FROM runrelay.cancellations;
    DELETE FROM runrelay.runs;
$$;

-- Whether a lease that a claim in the current statement returned is what a
-- fresh claim of p_seconds grants: granted during this statement (between
-- its start and now, on the shifted test clock), running p_seconds from the
-- grant, with lease_remaining_ms measured between the grant and now. Call it
-- in the select list over the claim, so that "now" comes after the claim.
CREATE FUNCTION tests.lease_granted(p_expires timestamptz, p_remaining bigint, p_seconds integer)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_offset interval := coalesce(nullif(current_setting('runrelay.clock_offset', TRUE), ''), '0')::interval;
    v_lease interval := make_interval(secs => p_seconds);
    v_now timestamptz := clock_timestamp() + v_offset;
BEGIN
    RETURN p_expires >= statement_timestamp() + v_offset + v_lease
        AND p_expires <= v_now + v_lease
        AND p_remaining <= p_seconds * 1000
        AND p_remaining >= floor(extract(EPOCH FROM p_expires - v_now) * 1000)::bigint;
END;
$$;
