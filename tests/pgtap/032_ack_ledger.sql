-- ack_ledger (SPEC §3.3): delivered with lag_ms, only this relay's leases,
-- only an unbroken prefix, harmless repeats, claim_next continuation (kinds
-- claimed and local_ack, with lag_ms), exact replays that write nothing, and
-- drop_on_delivery payloads.
BEGIN;
SELECT plan(31);

-- Delivered, with lag_ms = delivered - created.
SELECT tests.ledger_run('a1');
SELECT tests.append('a1', ARRAY['a', 'b', 'c', 'd']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'a1');
SELECT set_config('runrelay.clock_offset', '10 seconds', TRUE);
SELECT results_eq(
    $$SELECT kind, run_id, seq, type, delivery_key, payload, frozen, lease_expires_at, lease_remaining_ms, lag_ms >= 10000
      FROM runrelay.ack_ledger(relay => 'x', run_id => 'a1', event_ids => ARRAY[tests.eid('a1', 'a')])$$,
    $$VALUES ('delivered', 'a1', 2::bigint, 'a', 'a1:2', '{"n": 1}'::jsonb, FALSE, NULL::timestamptz, NULL::bigint, TRUE)$$,
    'an ack reports the event delivered, without a lease, with lag_ms'
);
SELECT results_eq(
    $$SELECT state, delivered_by, lease_owner, lease_expires_at, delivered_at IS NOT NULL
      FROM runrelay.ledger WHERE event_id = tests.eid('a1', 'a')$$,
    $$VALUES ('delivered', 'x', NULL::text, NULL::timestamptz, TRUE)$$,
    'the event is delivered by the relay and its lease is cleared'
);
CREATE TEMPORARY TABLE first_ack AS
SELECT
    l.delivered_at,
    floor(extract(EPOCH FROM l.delivered_at - l.created_at) * 1000)::bigint AS lag_ms
FROM runrelay.ledger AS l
WHERE l.event_id = tests.eid('a1', 'a');
SELECT set_config('runrelay.clock_offset', '40 seconds', TRUE);
SELECT results_eq(
    $$SELECT kind, type, lag_ms FROM runrelay.ack_ledger(relay => 'x', run_id => 'a1', event_ids => ARRAY[tests.eid('a1', 'a')])$$,
    $$SELECT 'delivered', 'a', lag_ms FROM first_ack$$,
    'acknowledging twice reports delivered again with the same lag_ms'
);
SELECT is(
    (
        SELECT delivered_at FROM runrelay.ledger
        WHERE event_id = tests.eid('a1', 'a')
    ),
    (SELECT delivered_at FROM first_ack),
    'a repeated ack does not move delivered_at'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'y', run_id => 'a1', event_ids => ARRAY[tests.eid('a1', 'a')])$$,
    'another relay is not told about an event this relay delivered'
);

-- Only events leased by that relay.
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'a1', event_ids => ARRAY[tests.eid('a1', 'b')])$$,
    'a pending (unclaimed) event is not acknowledged'
);
SELECT is(tests.ev_state(tests.eid('a1', 'b')), 'pending', '... and stays pending');
SELECT runrelay.claim_ledger(relay => 'y', run_id => 'a1');
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'a1', event_ids => ARRAY[tests.eid('a1', 'b')])$$,
    'an event leased by another relay is not acknowledged'
);
SELECT is(tests.ev_state(tests.eid('a1', 'b')), 'leased:y', '... and keeps its lease');
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'other-run', event_ids => ARRAY[tests.eid('a1', 'b')])$$,
    'an event is not acknowledged under another run_id'
);
SELECT is(tests.ev_state(tests.eid('a1', 'b')), 'leased:y', '... still leased');

-- Only an unbroken prefix.
SELECT tests.ledger_run('p1');
SELECT tests.append('p1', ARRAY['a', 'b', 'c']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'p1', max_events => 3, batch => TRUE);
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['b', 'c']))$$,
    'events behind an outstanding head are not acknowledged'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['c', 'a']))$$,
    $$VALUES ('delivered', 'a')$$,
    'only the unbroken prefix of event_ids is acknowledged (a, not c after the gap b)'
);
SELECT
    is(
        tests.ledger_states('p1'), ARRAY['run.queued=delivered:fixture', 'a=delivered:x', 'b=leased:x', 'c=leased:x'], 'b and c stay leased'
    );
SELECT results_eq(
    $$SELECT kind, type, frozen FROM runrelay.ack_ledger(relay => 'x', run_id => 'p1', event_ids => tests.eids('p1', ARRAY['b', 'c']))$$,
    $$VALUES ('delivered', 'b', TRUE), ('delivered', 'c', TRUE)$$,
    'the rest of the batch is acknowledged in seq order, reported as frozen'
);

-- claim_next: ack and continue in one statement.
SELECT tests.ledger_run('n1');
SELECT tests.append('n1', ARRAY['a', 'b', 'c', 'd']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'n1');
SELECT results_eq(
    $$SELECT kind, type, frozen, lease_remaining_ms IS NULL OR tests.lease_granted(lease_expires_at, lease_remaining_ms, 30)
      FROM runrelay.ack_ledger(relay => 'x', run_id => 'n1', event_ids => ARRAY[tests.eid('n1', 'a')], claim_next => 5)$$,
    $$VALUES ('delivered', 'a', FALSE, TRUE), ('claimed', 'b', FALSE, TRUE)$$,
    'claim_next without batch claims the successor head alone'
);
SELECT results_eq(
    $$SELECT kind, type, frozen, lease_remaining_ms IS NULL OR tests.lease_granted(lease_expires_at, lease_remaining_ms, 300)
      FROM runrelay.ack_ledger(
          relay => 'x', run_id => 'n1', event_ids => ARRAY[tests.eid('n1', 'b')], claim_next => 2, batch => TRUE, lease_seconds => 1000)$$,
    $$VALUES ('delivered', 'b', FALSE, TRUE), ('claimed', 'c', TRUE, TRUE), ('claimed', 'd', TRUE, TRUE)$$,
    'claim_next with batch claims the successor prefix as a frozen batch; lease_seconds is clamped to 300'
);
SELECT tests.append('n1', ARRAY['t'], 'lifecycle', TRUE);
SELECT tests.append('n1', ARRAY['e', 'f', 'g']);
CREATE TEMPORARY TABLE n1_ack AS
SELECT a.*
FROM runrelay.ack_ledger(
    relay => 'x', run_id => 'n1', event_ids => tests.eids('n1', ARRAY['c', 'd']), claim_next => 2, batch => TRUE
) AS a;
SELECT results_eq(
    $$SELECT kind, type, lag_ms IS NOT NULL, lease_expires_at IS NOT NULL FROM n1_ack ORDER BY seq$$,
    $$VALUES
        ('delivered', 'c', TRUE, FALSE), ('delivered', 'd', TRUE, FALSE), ('local_ack', 't', TRUE, FALSE),
        ('claimed', 'e', FALSE, TRUE), ('claimed', 'f', FALSE, TRUE)$$,
    'claim_next acknowledges a transport-only successor locally (with its lag_ms) and claims the prefix behind it'
);
SELECT results_eq(
    $$SELECT lag_ms FROM n1_ack WHERE kind = 'local_ack'$$,
    $$SELECT floor(extract(EPOCH FROM delivered_at - created_at) * 1000)::bigint FROM runrelay.ledger
      WHERE event_id = tests.eid('n1', 't')$$,
    'the local ack''s lag_ms is delivered_at - created_at, as for a delivered event'
);
CREATE TEMPORARY TABLE n1_rows AS
SELECT
    l.event_id,
    l.state,
    l.lease_owner,
    l.lease_expires_at,
    l.delivered_at,
    l.acked_locally,
    l.call_id,
    l.payload
FROM runrelay.ledger AS l
WHERE l.run_id = 'n1';
-- The repeat comes later: a re-claim would show as a moved lease.
SELECT set_config('runrelay.clock_offset', '5 seconds', TRUE);
SELECT results_eq(
    $$SELECT kind, event_id, run_id, seq, type, payload, delivery_key, created_at, frozen, lease_expires_at, lag_ms
      FROM runrelay.ack_ledger(
          relay => 'x', run_id => 'n1', event_ids => tests.eids('n1', ARRAY['c', 'd']), claim_next => 2, batch => TRUE)$$,
    $$SELECT kind, event_id, run_id, seq, type, payload, delivery_key, created_at, frozen, lease_expires_at, lag_ms
      FROM n1_ack ORDER BY seq$$,
    'a replay after a lost reply answers exactly the first outcome: delivered, local_ack and claimed rows, same leases and lag_ms'
);
SELECT results_eq(
    $$SELECT l.event_id, l.state, l.lease_owner, l.lease_expires_at, l.delivered_at, l.acked_locally, l.call_id, l.payload
      FROM runrelay.ledger AS l WHERE l.run_id = 'n1' ORDER BY l.event_id$$,
    $$SELECT * FROM n1_rows ORDER BY event_id$$,
    'the replay writes nothing: no lease is extended, nothing more is claimed'
);
SELECT set_config('runrelay.clock_offset', '', TRUE);
SELECT is(tests.ev_state(tests.eid('n1', 'g')), 'pending', 'the replay did not widen the claimed prefix');
SELECT is_empty(
    $$SELECT * FROM runrelay.ack_ledger(relay => 'x', run_id => 'n1', event_ids => ARRAY[tests.eid('n1', 't')])$$,
    'a locally acknowledged event is not reported as delivered by ack_ledger'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(relay => 'x', run_id => 'n1', event_ids => '{}', claim_next => 1)$$,
    $$VALUES ('claimed', 'e'), ('claimed', 'f')$$,
    'claim_next with nothing to acknowledge re-claims the relay''s own frozen head batch'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 'n1', event_ids => tests.eids('n1', ARRAY['e', 'f']), claim_next => 1)$$,
    $$VALUES ('delivered', 'e'), ('delivered', 'f'), ('claimed', 'g')$$,
    'the next ack is a call of its own: it acknowledges and claims afresh'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 'n1', event_ids => tests.eids('n1', ARRAY['c', 'd']), claim_next => 2, batch => TRUE)$$,
    $$VALUES ('delivered', 'c'), ('delivered', 'd'), ('local_ack', 't')$$,
    'a late replay answers what remains of the first outcome: its leases were acknowledged since'
);

-- Observability lane: the lane is taken from the events.
SELECT tests.append('n1', ARRAY['log1', 'log2'], 'observability');
SELECT runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'n1');
SELECT results_eq(
    $$SELECT kind, type
      FROM runrelay.ack_ledger(relay => 'x', run_id => 'n1', event_ids => ARRAY[tests.eid('n1', 'log1')], claim_next => 1)$$,
    $$VALUES ('delivered', 'log1'), ('claimed', 'log2')$$,
    'acking an observability event continues on the observability lane'
);

-- drop_on_delivery.
SELECT tests.ledger_run('drop', 'drop_on_delivery');
SELECT tests.ledger_run('keep', 'keep');
SELECT tests.append('drop', ARRAY['a', 'b']);
SELECT tests.append('keep', ARRAY['a']);
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'drop');
SELECT runrelay.claim_ledger(relay => 'x', run_id => 'keep');
SELECT results_eq(
    $$SELECT kind, payload FROM runrelay.ack_ledger(relay => 'x', run_id => 'drop', event_ids => ARRAY[tests.eid('drop', 'a')])$$,
    $$VALUES ('delivered', NULL::jsonb)$$,
    'a drop_on_delivery run: the acknowledged event is reported without its payload'
);
SELECT results_eq(
    $$SELECT type, payload FROM runrelay.ledger WHERE run_id = 'drop' AND type IN ('a', 'b') ORDER BY seq$$,
    $$VALUES ('a', NULL::jsonb), ('b', '{"n": 2}'::jsonb)$$,
    'its stored payload is dropped on delivery; an undelivered event keeps its payload'
);
SELECT results_eq(
    $$SELECT kind, payload FROM runrelay.ack_ledger(relay => 'x', run_id => 'keep', event_ids => ARRAY[tests.eid('keep', 'a')])$$,
    $$VALUES ('delivered', '{"n": 1}'::jsonb)$$,
    'a keep run keeps the payload of a delivered event'
);
SELECT is(
    (
        SELECT payload FROM runrelay.ledger
        WHERE event_id = tests.eid('keep', 'a')
    ), '{"n": 1}'::jsonb,
    'and it stays stored'
);

SELECT * FROM finish();
ROLLBACK;
