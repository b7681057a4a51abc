-- The lease watermark (schema/06_ledger.sql, docs/ledger.md "Where a lease is
-- stored"): a lease is its lane's, from the head through leased_through, so
-- leasing a batch writes one lane row and no event row, and an
-- acknowledgement writes one delivery row for its prefix and no event row;
-- the ledger view reads each event's lease from its lane and its delivery
-- from the delivery row. A lease covers an unbroken run of its lane:
-- renewing any of its events renews it all; releasing or failing an event
-- hands back the leased events behind it, uncharged, in their frozen batch.
BEGIN;
SELECT plan(16);

CREATE TEMPORARY TABLE counters AS
SELECT
    pg_stat_get_xact_tuples_updated('runrelay.ledger_events'::regclass) AS event_updates,
    pg_stat_get_xact_tuples_updated('runrelay.ledger_lanes'::regclass) AS lane_updates;

CREATE FUNCTION pg_temp.since(p_what text)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT CASE p_what
        WHEN 'event_updates' THEN pg_stat_get_xact_tuples_updated('runrelay.ledger_events'::regclass) - c.event_updates
        ELSE pg_stat_get_xact_tuples_updated('runrelay.ledger_lanes'::regclass) - c.lane_updates
    END
    FROM counters AS c;
$$;

CREATE FUNCTION pg_temp.reset()
RETURNS void
LANGUAGE sql
AS $$
    UPDATE counters SET
        event_updates = pg_stat_get_xact_tuples_updated('runrelay.ledger_events'::regclass),
        lane_updates = pg_stat_get_xact_tuples_updated('runrelay.ledger_lanes'::regclass);
$$;

SELECT tests.ledger_run('w1');
SELECT tests.append('w1', ARRAY['a', 'b', 'c', 'd', 'e'], 'observability');
SELECT pg_temp.reset();
SELECT is(
    (SELECT count(*) FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'w1', max_events => 5, batch => TRUE)),
    5::bigint,
    'a batch of five is claimed'
);
SELECT is(pg_temp.since('event_updates'), 0::bigint, 'leasing the batch writes no event row');
SELECT is(pg_temp.since('lane_updates'), 1::bigint, '... but one lane row');
SELECT results_eq(
    $$SELECT count(*), count(DISTINCT batch_id), count(DISTINCT lease_expires_at), min(lease_owner)
      FROM runrelay.ledger WHERE run_id = 'w1' AND lane = 'observability' AND state = 'leased'$$,
    $$VALUES (5::bigint, 1::bigint, 1::bigint, 'x')$$,
    'the ledger view reads the five as leased to x, in one batch, until one expiry'
);

SELECT pg_temp.reset();
SELECT is(
    (
        SELECT count(*) FROM runrelay.ack_ledger(relay => 'x', run_id => 'w1', event_ids => tests.eids('w1', ARRAY['a', 'b']))
        WHERE kind = 'delivered'
    ),
    2::bigint,
    'a prefix of the batch is acknowledged'
);
SELECT is(pg_temp.since('event_updates'), 0::bigint, 'the acknowledgement writes no event row');
SELECT results_eq(
    $$SELECT first_seq, last_seq, delivered_by, batch_id IS NOT NULL FROM runrelay.ledger_deliveries
      WHERE run_id = 'w1' AND lane = 'observability'$$,
    $$SELECT min(seq), max(seq), 'x', TRUE FROM runrelay.ledger_events
      WHERE run_id = 'w1' AND lane = 'observability' AND type IN ('a', 'b')$$,
    '... but one delivery row, for the prefix a..b of the batch'
);
SELECT results_eq(
    $$SELECT type, state, batch_id IS NOT NULL FROM runrelay.ledger
      WHERE run_id = 'w1' AND lane = 'observability' ORDER BY seq$$,
    $$VALUES ('a', 'delivered', TRUE), ('b', 'delivered', TRUE), ('c', 'leased', TRUE), ('d', 'leased', TRUE),
             ('e', 'leased', TRUE)$$,
    'the delivered events keep their batch; the rest stay leased'
);

-- Renewing one event renews the lease, which is the lane's.
SELECT is(
    (SELECT count(*) FROM runrelay.renew_ledger_lease('x', tests.eids('w1', ARRAY['d']), 100)),
    1::bigint,
    'renew answers the events it was given'
);
SELECT is(
    (
        SELECT count(DISTINCT lease_expires_at) FROM runrelay.ledger
        WHERE run_id = 'w1' AND lane = 'observability' AND state = 'leased'
    ),
    1::bigint,
    '... and the whole lease has the new expiry'
);

-- Failing a middle member hands back what follows it; the prefix stays leased.
SELECT results_eq(
    $$SELECT outcome FROM runrelay.fail_ledger('x', tests.eids('w1', ARRAY['d']), '{}', retry_at => now() - interval '1 second')$$,
    $$VALUES ('retrying')$$,
    'the middle member fails, retrying'
);
SELECT is(
    tests.ledger_states('w1'),
    ARRAY['run.queued=delivered:fixture', 'a=delivered:x', 'b=delivered:x', 'c=leased:x', 'd=pending', 'e=pending'],
    'the lease now ends before the failed event'
);
SELECT results_eq(
    $$SELECT type, state, lease_owner, delivery_attempts, batch_id IS NOT NULL FROM runrelay.ledger
      WHERE run_id = 'w1' AND lane = 'observability' AND delivered_at IS NULL ORDER BY seq$$,
    $$VALUES ('c', 'leased', 'x', 0, TRUE), ('d', 'pending', NULL, 1, TRUE), ('e', 'pending', NULL, 0, TRUE)$$,
    'the event before it stays leased; it and the one behind it are pending, in the frozen batch, only it charged'
);
SELECT results_eq(
    $$SELECT kind, type FROM runrelay.ack_ledger(
        relay => 'x', run_id => 'w1', event_ids => tests.eids('w1', ARRAY['c']), claim_next => 10, batch => TRUE)$$,
    $$VALUES ('delivered', 'c'), ('claimed', 'd'), ('claimed', 'e')$$,
    'the leased prefix is acknowledged, and the claim-next re-leases exactly the rest of the batch'
);

-- Releasing the head hands back the whole lease.
SELECT is(runrelay.release_ledger('x', tests.eids('w1', ARRAY['d'])), 1, 'release counts the events it was given');
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger
        WHERE run_id = 'w1' AND lane = 'observability' AND state = 'leased'
    ),
    0::bigint,
    '... and the leased events behind the head went back with it'
);

SELECT * FROM finish();
ROLLBACK;
