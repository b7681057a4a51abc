-- Transport-only events (SPEC §1, §3.3): a due transport-only head is
-- acknowledged locally (kind local_ack) by the next claim of its lane,
-- whether or not anything follows it, through the same acknowledgement as a
-- delivery (drop_on_delivery, lag_ms); its lane is due, so discovery and
-- ledger_next_due_at bring a relay back for it. expected_head may name an
-- event behind transport-only heads, or a transport-only event itself.
-- call_id replays report local acks again.
BEGIN;
SELECT plan(34);

-- A ledger run whose lifecycle lane holds the transport-only events
-- p_transport_only, then the events p_then.
CREATE FUNCTION pg_temp.transport_only_first(p_run_id text, p_transport_only text[], p_then text[] DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM tests.ledger_run(p_run_id);
    PERFORM tests.append(p_run_id, p_transport_only, 'lifecycle', TRUE);
    IF cardinality(p_then) > 0 THEN
        PERFORM tests.append(p_run_id, p_then);
    END IF;
END;
$$;

-- Head with a claimable successor.
SELECT pg_temp.transport_only_first('t1', ARRAY['t'], ARRAY['a', 'b']);
SELECT results_eq(
    $$SELECT kind, type, seq, frozen, lease_expires_at IS NULL,
             lease_remaining_ms IS NULL OR tests.lease_granted(lease_expires_at, lease_remaining_ms, 30)
      FROM runrelay.claim_ledger(relay => 'x', run_id => 't1')$$,
    $$VALUES ('local_ack', 't', 2::bigint, FALSE, TRUE, TRUE), ('claimed', 'a', 3::bigint, FALSE, FALSE, TRUE)$$,
    'a transport-only head is acknowledged locally and its successor claimed, in one call'
);
SELECT results_eq(
    $$SELECT state, delivered_by, lease_owner, acked_locally FROM runrelay.ledger WHERE event_id = tests.eid('t1', 't')$$,
    $$VALUES ('delivered', 'x', NULL::text, TRUE)$$,
    'the local ack marks the event delivered by the claiming relay'
);
SELECT is(tests.ev_state(tests.eid('t1', 'b')), 'pending', 'batch => false: only the head behind it is claimed');

-- A lone transport-only head does not rest: its lane is due and the next
-- claim acknowledges it.
SELECT pg_temp.transport_only_first('t2', ARRAY['t']);
SELECT is(
    runrelay.ledger_next_due_at(lane => 'lifecycle', run_id => 't2'),
    (
        SELECT created_at FROM runrelay.ledger
        WHERE event_id = tests.eid('t2', 't')
    ),
    'a lone transport-only head is due from its creation, like any head'
);
SELECT results_eq(
    $$SELECT kind, type, lease_expires_at FROM runrelay.claim_ledger(relay => 'x', run_id => 't2', max_events => 5, batch => TRUE)$$,
    $$VALUES ('local_ack', 't', NULL::timestamptz)$$,
    'the next claim acknowledges a lone transport-only head locally, without a successor'
);
SELECT is(tests.ev_state(tests.eid('t2', 't')), 'delivered:x', 'it is delivered (locally), no longer pending');
SELECT is(
    runrelay.ledger_next_due_at(lane => 'lifecycle', run_id => 't2'), NULL,
    'the lane has nothing pending afterwards'
);
SELECT tests.append('t2', ARRAY['a']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'y', run_id => 't2')$$,
    $$VALUES ('claimed', 'a')$$,
    'an event appended later is claimed as the head'
);

-- Consecutive transport-only events are all acknowledged.
SELECT pg_temp.transport_only_first('t3', ARRAY['t1', 't2']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 't3')$$,
    $$VALUES ('local_ack', 't1'), ('local_ack', 't2')$$,
    'two transport-only events in a row are both acknowledged locally'
);
SELECT tests.append('t3', ARRAY['t3']::text[], 'lifecycle', TRUE);
SELECT tests.append('t3', ARRAY['a', 'b']);
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.claim_ledger(relay => 'x', run_id => 't3', max_events => 5, batch => TRUE)$$,
    $$VALUES ('local_ack', 't3', FALSE), ('claimed', 'a', TRUE), ('claimed', 'b', TRUE)$$,
    'local acks precede a batch claim of the events behind them'
);

-- A transport-only successor ends a batch.
SELECT tests.ledger_run('t4');
SELECT tests.append('t4', ARRAY['a', 'b']);
SELECT tests.append('t4', ARRAY['t'], 'lifecycle', TRUE);
SELECT tests.append('t4', ARRAY['c']);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(relay => 'x', run_id => 't4', max_events => 10, batch => TRUE)$$,
    $$VALUES ('claimed', 'a'), ('claimed', 'b')$$,
    'a batch stops before a transport-only event'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 't4', event_ids => tests.eids('t4', ARRAY['a', 'b']), claim_next => 10, batch => TRUE)$$,
    $$VALUES ('delivered', 'a'), ('delivered', 'b'), ('local_ack', 't'), ('claimed', 'c')$$,
    'ack with claim_next acknowledges it locally and claims what follows'
);
SELECT tests.append('t4', ARRAY['u'], 'lifecycle', TRUE);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 't4', event_ids => ARRAY[tests.eid('t4', 'c')], claim_next => 10, batch => TRUE)$$,
    $$VALUES ('delivered', 'c'), ('local_ack', 'u')$$,
    'ack with claim_next acknowledges a lone transport-only successor locally'
);

-- A local ack is an acknowledgement: drop_on_delivery drops the payload.
SELECT tests.ledger_run('drop', 'drop_on_delivery');
SELECT tests.append('drop', ARRAY['t'], 'lifecycle', TRUE);
SELECT results_eq(
    $$SELECT kind, type, payload FROM runrelay.claim_ledger(relay => 'x', run_id => 'drop')$$,
    $$VALUES ('local_ack', 't', NULL::jsonb)$$,
    'a drop_on_delivery run: a local ack is reported without the payload'
);
SELECT is(
    (
        SELECT payload FROM runrelay.ledger
        WHERE event_id = tests.eid('drop', 't')
    ), NULL,
    '... and the stored payload is dropped'
);
SELECT tests.ledger_run('keep', 'keep');
SELECT tests.append('keep', ARRAY['t'], 'lifecycle', TRUE);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'keep');
SELECT is(
    (
        SELECT payload FROM runrelay.ledger
        WHERE event_id = tests.eid('keep', 't')
    ), '{"n": 1}'::jsonb,
    'a keep run keeps the payload of a locally acknowledged event'
);

-- expected_head and transport-only events: relay x claims run p_run_id
-- expecting its event of type p_head at the head.
CREATE FUNCTION pg_temp.claim_expecting(p_run_id text, p_head text, p_max_events integer DEFAULT 1, p_batch boolean DEFAULT FALSE)
RETURNS SETOF runrelay.claim_ledger_result
LANGUAGE sql
AS $$
    SELECT * FROM runrelay.claim_ledger(
        relay => 'x', run_id => p_run_id, expected_head => tests.eid(p_run_id, p_head),
        max_events => p_max_events, batch => p_batch
    );
$$;

SELECT pg_temp.transport_only_first('e1', ARRAY['tw'], ARRAY['y', 'z']);
SELECT results_eq(
    $$SELECT kind, type FROM pg_temp.claim_expecting('e1', 'y')$$,
    $$VALUES ('local_ack', 'tw'), ('claimed', 'y')$$,
    'expected_head behind a transport-only head: the head is acknowledged locally and the named event claimed'
);
SELECT is(tests.ev_state(tests.eid('e1', 'z')), 'pending', '... and nothing behind it');
SELECT pg_temp.transport_only_first('e2', ARRAY['tw'], ARRAY['y']);
SELECT results_eq(
    $$SELECT kind, type FROM pg_temp.claim_expecting('e2', 'tw', 5, TRUE)$$,
    $$VALUES ('local_ack', 'tw')$$,
    'expected_head naming a transport-only head acknowledges exactly it'
);
SELECT is(tests.ev_state(tests.eid('e2', 'y')), 'pending', '... and claims nothing that was not named');
SELECT pg_temp.transport_only_first('e3', ARRAY['tw1', 'tw2'], ARRAY['y']);
SELECT results_eq(
    $$SELECT kind, type FROM pg_temp.claim_expecting('e3', 'tw2')$$,
    $$VALUES ('local_ack', 'tw1'), ('local_ack', 'tw2')$$,
    'expected_head naming a transport-only event behind another: both acknowledged, nothing claimed'
);
SELECT is(tests.ev_state(tests.eid('e3', 'y')), 'pending', '... y stays pending');
SELECT pg_temp.transport_only_first('e4', ARRAY['tw'], ARRAY['x', 'y']);
SELECT is_empty(
    $$SELECT * FROM pg_temp.claim_expecting('e4', 'y')$$,
    'expected_head behind an event that is not transport-only: nothing'
);
SELECT is(
    tests.ledger_states('e4'), ARRAY['run.queued=delivered:fixture', 'tw=pending', 'x=pending', 'y=pending'],
    '... and nothing is acknowledged or leased'
);

-- call_id replays report local acks again.
SELECT tests.ledger_run('t5');
SELECT tests.append('t5', ARRAY['t'], 'observability', TRUE);
SELECT tests.append('t5', ARRAY['a'], 'observability');
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't'), ('claimed', 'a')$$,
    'a claim with a call_id acknowledges locally and claims'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't'), ('claimed', 'a')$$,
    'its replay reports the local ack as local_ack and the lease as claimed'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', call_id => '00000000-0000-4000-8000-0000000000a6') WHERE run_id = 't5'$$,
    'another call_id does not see them'
);
SELECT runrelay.ack_ledger(relay => 'x', run_id => 't5', event_ids => ARRAY[tests.eid('t5', 'a')]);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.claim_ledger(
        relay => 'x', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    $$VALUES ('local_ack', 't')$$,
    'after the lease was acknowledged, a replay still reports the local ack and leases nothing new'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_ledger(
        relay => 'y', lane => 'observability', run_id => 't5', call_id => '00000000-0000-4000-8000-0000000000a5')$$,
    'another relay with the same call_id is not told about x''s local ack'
);

-- Discovery comes back for lone transport-only heads, so they do not linger
-- in ledger_stats as pending.
SELECT tests.clear_runs();
SELECT set_config('runrelay.clock_offset', '-1 hour', TRUE);
SELECT tests.ledger_run('rest' || i) FROM generate_series(1, 3) AS i;
SELECT tests.append('rest' || i, ARRAY['t'], 'observability', TRUE) FROM generate_series(1, 3) AS i;
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT tests.ledger_run('work');
SELECT tests.append('work', ARRAY['job'], 'observability');
SELECT results_eq(
    $$SELECT events, oldest_pending_age_seconds >= 3600 FROM runrelay.ledger_stats
      WHERE lane = 'observability' AND state = 'pending'$$,
    $$VALUES (4::bigint, TRUE)$$,
    'before any claim: three hour-old transport-only heads and a job are pending'
);
SELECT is(
    runrelay.ledger_next_due_at(lane => 'observability'),
    (
        SELECT min(created_at) FROM runrelay.ledger
        WHERE lane = 'observability'
    ),
    'the oldest transport-only head makes the lane due'
);
CREATE TEMPORARY TABLE discovered (n integer, run_id text, kind text, type text);
-- Four claims one after the other, as a relay's discovery loop makes them.
DO $$
BEGIN
    FOR i IN 1..4 LOOP
        INSERT INTO discovered (n, run_id, kind, type)
        SELECT i, c.run_id, c.kind, c.type
        FROM runrelay.claim_ledger(relay => 'x', lane => 'observability') AS c;
    END LOOP;
END;
$$;
SELECT results_eq(
    $$SELECT n, kind, type FROM discovered ORDER BY n$$,
    $$VALUES (1, 'local_ack', 't'), (2, 'local_ack', 't'), (3, 'local_ack', 't'), (4, 'claimed', 'job')$$,
    'discovery acknowledges each older lone transport-only head (oldest first), then claims the work'
);
SELECT is(
    (
        SELECT array_agg(run_id ORDER BY run_id) FROM discovered
        WHERE kind = 'local_ack'
    ),
    ARRAY['rest1', 'rest2', 'rest3'],
    '... one per run'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.ledger_stats WHERE lane = 'observability' AND state = 'pending'$$,
    'afterwards nothing is pending: ledger_stats counts them delivered'
);

SELECT * FROM finish();
ROLLBACK;
