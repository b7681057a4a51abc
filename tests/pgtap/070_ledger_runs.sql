-- claim_ledger_runs and ack_ledger_runs: several runs' lanes per call.
BEGIN;
SELECT plan(34);

SELECT tests.clear_runs();

-- Four runs with pending lifecycle events, appended in run order (so the
-- oldest due lanes are a, b, c, d), and a fifth whose head another relay holds.
SELECT tests.ledger_run(r) FROM unnest(ARRAY['lr_a', 'lr_b', 'lr_c', 'lr_d', 'lr_e']) AS r;
SELECT tests.append('lr_a', ARRAY['a.1', 'a.2']);
SELECT tests.append('lr_b', ARRAY['b.1']);
SELECT tests.append('lr_c', ARRAY['c.t'], 'lifecycle', TRUE);
SELECT tests.append('lr_c', ARRAY['c.1']);
SELECT tests.append('lr_d', ARRAY['d.1']);
SELECT tests.append('lr_e', ARRAY['e.1']);
SELECT is(
    (SELECT count(*)::integer FROM runrelay.claim_ledger(relay => 'other', run_id => 'lr_e', batch => TRUE)),
    1, 'another relay holds lr_e'
);

-- claim_ledger_runs: three runs, oldest due first, answered in run and seq order.
CREATE TEMP TABLE first_claim AS
SELECT * FROM runrelay.claim_ledger_runs(
    relay => 'r1', max_runs => 3, call_id => '00000000-0000-0000-0000-0000000000a1'
);
SELECT is(
    (SELECT array_agg(f.kind || ':' || f.type ORDER BY f.run_id, f.seq) FROM first_claim AS f),
    ARRAY['claimed:a.1', 'claimed:a.2', 'claimed:b.1', 'local_ack:c.t', 'claimed:c.1'],
    'three runs: each run''s batch, a transport-only head acknowledged locally'
);
SELECT ok(
    (
        SELECT bool_and(f.frozen AND f.lease_expires_at IS NOT NULL) FROM first_claim AS f
        WHERE f.kind = 'claimed'
    ),
    'the claimed rows are frozen batches with a lease'
);
SELECT is(
    tests.ledger_states('lr_a'), ARRAY['run.queued=delivered:fixture', 'a.1=leased:r1', 'a.2=leased:r1'],
    'lr_a is leased to r1'
);
SELECT is(tests.ledger_states('lr_d'), ARRAY['run.queued=delivered:fixture', 'd.1=pending'], 'lr_d is left');
SELECT is(
    (SELECT array_agg(f.run_id ORDER BY f.run_id, f.seq) FROM first_claim AS f),
    (SELECT array_agg(f.run_id) FROM first_claim AS f),
    'rows come in run_id and seq order'
);

-- Replay: the same call_id answers the same rows and claims nothing more.
SELECT is(
    (
        SELECT array_agg(c.kind || ':' || c.type ORDER BY c.run_id, c.seq)
        FROM runrelay.claim_ledger_runs(
            relay => 'r1', max_runs => 3, call_id => '00000000-0000-0000-0000-0000000000a1'
        ) AS c
    ),
    (SELECT array_agg(f.kind || ':' || f.type ORDER BY f.run_id, f.seq) FROM first_claim AS f),
    'a repeated call answers what the first did'
);
SELECT is(tests.ledger_states('lr_d'), ARRAY['run.queued=delivered:fixture', 'd.1=pending'], 'and claims nothing more');

-- A second claim takes what is left: lr_d (lr_e is another relay's).
SELECT is(
    (SELECT array_agg(c.type ORDER BY c.run_id, c.seq) FROM runrelay.claim_ledger_runs(relay => 'r1', max_runs => 10) AS c),
    ARRAY['d.1'], 'the next claim takes the run left, not one another relay holds'
);

-- ack_ledger_runs: the delivered events of three runs, then the next runs.
SELECT tests.append('lr_f', ARRAY['f.1']) FROM (SELECT tests.ledger_run('lr_f')) AS x;
CREATE TEMP TABLE first_ack AS
SELECT * FROM runrelay.ack_ledger_runs(
    relay => 'r1',
    event_ids => tests.eids('lr_b', ARRAY['b.1']) || tests.eids('lr_a', ARRAY['a.1', 'a.2'])
    || tests.eids('lr_c', ARRAY['c.1']),
    claim_runs => 5,
    call_id => '00000000-0000-0000-0000-0000000000b1'
);
SELECT is(
    (SELECT array_agg(f.kind || ':' || f.type) FROM first_ack AS f),
    ARRAY['delivered:a.1', 'delivered:a.2', 'delivered:b.1', 'delivered:c.1', 'claimed:f.1'],
    'the delivered rows run by run, then the claim of the next runs'
);
SELECT ok(
    (
        SELECT bool_and(f.lag_ms IS NOT NULL) FROM first_ack AS f
        WHERE f.kind = 'delivered'
    ),
    'delivered rows carry lag_ms'
);
SELECT is(
    (SELECT array_agg(f.kind || ':' || coalesce(f.payload::text, 'null')) FROM first_ack AS f),
    ARRAY['delivered:null', 'delivered:null', 'delivered:null', 'delivered:null', 'claimed:{"n": 1}'],
    'delivered rows leave out the payload the relay sent; claimed rows carry theirs'
);
SELECT is(
    tests.ledger_states('lr_a'), ARRAY['run.queued=delivered:fixture', 'a.1=delivered:r1', 'a.2=delivered:r1'],
    'lr_a is delivered'
);
SELECT is(
    (
        SELECT ll.head_seq FROM runrelay.ledger_lanes AS ll
        WHERE ll.run_id = 'lr_a' AND ll.lane = 'lifecycle'
    ),
    NULL, 'lr_a''s lane is empty'
);

-- Replay: the same answer, nothing written.
SELECT is(
    (
        SELECT array_agg(a.kind || ':' || a.type)
        FROM runrelay.ack_ledger_runs(
            relay => 'r1',
            event_ids => tests.eids('lr_b', ARRAY['b.1']) || tests.eids('lr_a', ARRAY['a.1', 'a.2'])
            || tests.eids('lr_c', ARRAY['c.1']),
            claim_runs => 5,
            call_id => '00000000-0000-0000-0000-0000000000b1'
        ) AS a
    ),
    (SELECT array_agg(f.kind || ':' || f.type) FROM first_ack AS f),
    'a repeated acknowledgement answers what the first did'
);
SELECT is(
    (
        SELECT count(*)::integer FROM runrelay.ledger AS l
        WHERE l.run_id = 'lr_f' AND l.state = 'leased'
    ),
    1, 'and leases nothing more'
);

-- Events leased to another relay are passed over, as ack_ledger passes them.
SELECT is(
    (
        SELECT count(*)::integer
        FROM runrelay.ack_ledger_runs(relay => 'r1', event_ids => tests.eids('lr_e', ARRAY['e.1']))
    ),
    0, 'another relay''s lease is not acknowledged'
);
SELECT is(tests.ledger_states('lr_e'), ARRAY['run.queued=delivered:fixture', 'e.1=leased:other'], 'lr_e is as it was');

-- Both lanes of one run in one call.
SELECT tests.ledger_run('lr_g');
SELECT tests.append('lr_g', ARRAY['g.1']);
SELECT tests.append('lr_g', ARRAY['g.o'], 'observability');
SELECT is(
    (SELECT count(*)::integer FROM runrelay.claim_ledger(relay => 'r1', run_id => 'lr_g', batch => TRUE)), 1,
    'lr_g''s lifecycle event leased'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM runrelay.claim_ledger(relay => 'r1', lane => 'observability', run_id => 'lr_g', batch => TRUE)
    ),
    1, 'lr_g''s observability event leased'
);
SELECT is(
    (
        SELECT array_agg(a.kind || ':' || a.type)
        FROM runrelay.ack_ledger_runs(relay => 'r1', event_ids => tests.eids('lr_g', ARRAY['g.o', 'g.1'])) AS a
    ),
    ARRAY['delivered:g.1', 'delivered:g.o'], 'both lanes acknowledged, lifecycle first'
);

-- claim_runs on an empty list claims like claim_ledger_runs.
SELECT tests.ledger_run('lr_h');
SELECT tests.append('lr_h', ARRAY['h.1']);
SELECT is(
    (SELECT array_agg(a.kind || ':' || a.type) FROM runrelay.ack_ledger_runs('r1', '{}', claim_runs => 1) AS a),
    ARRAY['claimed:h.1'], 'an empty acknowledgement with claim_runs claims'
);

-- Bad input: refused, naming the argument, nothing written.
SELECT tests.ledger_run('lr_i');
SELECT tests.append('lr_i', ARRAY['i.1']);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger_runs(relay => 'r1', max_runs => 0)$$,
    '22023', 'runrelay: invalid max_runs: must be between 1 and 1000 (got 0)', 'max_runs 0'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger_runs(relay => 'r1', max_runs => NULL)$$,
    '22023', 'runrelay: invalid max_runs: must be between 1 and 1000 (got null)', 'max_runs null'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger_runs(relay => 'r1', max_events => 1001)$$,
    '22023', 'runrelay: invalid max_events: must be between 1 and 1000 (got 1001)', 'max_events 1001'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.claim_ledger_runs(relay => '')$$, '%invalid relay%', 'an empty relay'
);
SELECT throws_like(
    $$SELECT * FROM runrelay.claim_ledger_runs(relay => 'r1', lane => 'other')$$, '%invalid lane%', 'an unknown lane'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.ack_ledger_runs('r1', '{}', claim_runs => -1)$$,
    '22023', 'runrelay: invalid claim_runs: must be between 0 and 1000 (got -1)', 'claim_runs -1'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.ack_ledger_runs('r1', ARRAY[1, NULL]::bigint[], claim_runs => 1)$$,
    '22023', 'runrelay: invalid event_ids: must not contain null', 'a null among event_ids'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.ack_ledger_runs('r1', '{}', claim_runs => 1, max_events => 0)$$,
    '22023', 'runrelay: invalid max_events: must be between 1 and 1000 (got 0)', 'max_events 0'
);
SELECT is(tests.ledger_states('lr_i'), ARRAY['run.queued=delivered:fixture', 'i.1=pending'], 'nothing was claimed');

-- A refused acknowledgement acknowledges nothing either.
SELECT is(
    (SELECT count(*)::integer FROM runrelay.claim_ledger(relay => 'r1', run_id => 'lr_i', batch => TRUE)), 1,
    'lr_i leased'
);
SELECT throws_ok(
    format(
        'SELECT * FROM runrelay.ack_ledger_runs(%L, %L::bigint[], claim_runs => 1001)',
        'r1', tests.eids('lr_i', ARRAY['i.1'])
    ),
    '22023', 'runrelay: invalid claim_runs: must be between 0 and 1000 (got 1001)', 'claim_runs 1001'
);
SELECT is(tests.ledger_states('lr_i'), ARRAY['run.queued=delivered:fixture', 'i.1=leased:r1'], 'nothing was acknowledged');

SELECT * FROM finish();
ROLLBACK;
