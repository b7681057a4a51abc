-- The ledger's short cuts against the general steps.
--
-- A claim that leases does not recompute its lane afterwards (the lease's
-- update already wrote what the recomputation would), and an acknowledgement
-- with claim_next whose lane has nothing after the acknowledged prefix goes
-- straight to the lane's recomputation instead of through a claim that finds
-- nothing (plpgsql/_internal/claim_lane.sql, plpgsql/ledger/ack_ledger.sql).
-- A session with runrelay.reference_paths on takes the general steps for
-- every call (_internal/reference_paths.sql). Each case runs the same calls
-- under the prefixes fast_<case>_ and ref_<case>_ (reference paths on): the
-- answers must be the same, and so must the events, the lanes and the
-- wake-ups left behind.
BEGIN;
SELECT plan(30);

-- A claim or acknowledgement row, normalised: no event ids, call ids or clock.
CREATE FUNCTION tests.lp_rows(p_prefix text, p_rows runrelay.ack_ledger_result[])
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'kind', r.kind,
        'run_id', replace(r.run_id, p_prefix, ''),
        'seq', r.seq,
        'type', r.type,
        'delivery_key', replace(r.delivery_key, p_prefix, ''),
        'frozen', r.frozen,
        'leased', r.lease_expires_at IS NOT NULL,
        'lag', r.lag_ms IS NOT NULL
    ) ORDER BY r.ord), '[]'::jsonb)
    FROM unnest(p_rows) WITH ORDINALITY AS r (
        kind, event_id, run_id, seq, type, payload, delivery_key, created_at, frozen,
        lease_expires_at, lease_remaining_ms, lag_ms, ord
    );
$$;

-- relay r1 claims run p_run's lifecycle lane, as a batch of up to p_max.
CREATE FUNCTION tests.lp_claim(p_prefix text, p_run text, p_max integer)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT tests.lp_rows(p_prefix, array_agg(
        (c.kind, c.event_id, c.run_id, c.seq, c.type, c.payload, c.delivery_key, c.created_at, c.frozen,
        c.lease_expires_at, c.lease_remaining_ms, NULL)::runrelay.ack_ledger_result
    ))
    FROM runrelay.claim_ledger(
        relay => 'r1', run_id => p_prefix || p_run, max_events => p_max, batch => TRUE
    ) AS c;
$$;

-- relay r1 acknowledges every event of run p_run's lifecycle lane that it
-- holds leased, then claims up to p_next.
CREATE FUNCTION tests.lp_ack(p_prefix text, p_run text, p_next integer, p_lease integer DEFAULT 30)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT tests.lp_rows(p_prefix, array_agg(a))
    FROM runrelay.ack_ledger(
        relay => 'r1',
        run_id => p_prefix || p_run,
        event_ids => (
            SELECT array_agg(l.event_id ORDER BY l.seq) FROM runrelay.ledger AS l
            WHERE l.run_id = p_prefix || p_run AND l.lane = 'lifecycle' AND l.state = 'leased'
        ),
        claim_next => p_next,
        lease_seconds => p_lease,
        batch => TRUE
    ) AS a;
$$;

-- A wake-up on run p_run's lifecycle lane from p_first_seq, as an appender
-- that found the lane locked leaves one (append.sql).
CREATE FUNCTION tests.lp_wakeup(p_prefix text, p_run text, p_first_seq bigint)
RETURNS jsonb
LANGUAGE sql
AS $$
    INSERT INTO runrelay.ledger_wakeups (run_id, lane, first_seq, created_at)
    VALUES (p_prefix || p_run, 'lifecycle', p_first_seq, now());
    SELECT '[]'::jsonb;
$$;

-- What the calls leave behind for a prefix: the events (as 027 compares
-- them), the lanes and the wake-ups.
CREATE FUNCTION tests.lp_snapshot(p_prefix text)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object(
        'ledger', tests.sc_snapshot(p_prefix) -> 'ledger',
        'owners', (
            SELECT jsonb_agg(coalesce(l.lease_owner, l.delivered_by) ORDER BY l.run_id, l.lane, l.seq)
            FROM runrelay.ledger AS l WHERE l.run_id LIKE p_prefix || '%'
        ),
        'lanes', tests.sc_lanes(p_prefix),
        'wakeups', (SELECT count(*) FROM runrelay.ledger_wakeups AS w WHERE w.run_id LIKE p_prefix || '%')
    );
$$;

-- The calls of a case on one side, in order ($p is the prefix): each one's
-- answer, or its error.
CREATE FUNCTION tests.lp_side(p_prefix text, p_calls text[], p_reference boolean)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_call text;
    v_out jsonb;
    v_answers jsonb := '[]'::jsonb;
BEGIN
    PERFORM set_config('runrelay.reference_paths', CASE WHEN p_reference THEN 'on' ELSE '' END, TRUE);
    FOREACH v_call IN ARRAY p_calls LOOP
        BEGIN
            EXECUTE 'SELECT ' || replace(v_call, '$p', quote_literal(p_prefix)) INTO v_out;
        EXCEPTION WHEN OTHERS THEN
            v_out := jsonb_build_object('error', SQLSTATE, 'message', replace(SQLERRM, p_prefix, ''));
        END;
        v_answers := v_answers || jsonb_build_array(v_out);
    END LOOP;
    PERFORM set_config('runrelay.reference_paths', '', TRUE);
    RETURN v_answers;
END;
$$;

-- Both sides of a case: the same answers (and the ones expected), the same rows.
CREATE FUNCTION tests.lp_case(p_case text, p_setup text, p_calls text[], p_expected jsonb)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    v_fast jsonb;
    v_ref jsonb;
BEGIN
    EXECUTE replace(p_setup, '$p', quote_literal('fast_' || p_case || '_'));
    EXECUTE replace(p_setup, '$p', quote_literal('ref_' || p_case || '_'));
    v_fast := tests.lp_side('fast_' || p_case || '_', p_calls, FALSE);
    v_ref := tests.lp_side('ref_' || p_case || '_', p_calls, TRUE);
    RETURN NEXT is(v_fast, v_ref, p_case || ': the short cuts answer as the general steps');
    RETURN NEXT is(
        (SELECT jsonb_agg(
            CASE WHEN jsonb_typeof(a.value) = 'array'
                THEN (
                    SELECT coalesce(jsonb_agg(
                        CASE WHEN jsonb_typeof(r.value) = 'object'
                            THEN to_jsonb((r.value ->> 'kind') || ':' || (r.value ->> 'seq'))
                            ELSE r.value
                        END ORDER BY r.ord
                    ), '[]'::jsonb)
                    FROM jsonb_array_elements(a.value) WITH ORDINALITY AS r (value, ord)
                )
                ELSE a.value
            END ORDER BY a.ord)
        FROM jsonb_array_elements(v_fast) WITH ORDINALITY AS a (value, ord)),
        p_expected,
        p_case || ': the expected answers (kind:seq of each row)'
    );
    RETURN NEXT is(
        tests.lp_snapshot('fast_' || p_case || '_'), tests.lp_snapshot('ref_' || p_case || '_'),
        p_case || ': the same events, lanes and wake-ups'
    );
END;
$$;

-- short: a run's whole lane in one batch; the acknowledgement's claim_next
-- finds nothing after it, and the lane ends empty.
SELECT tests.lp_case(
    'short',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.one', 'x.two', 'x.three'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 100)$$,
        $$tests.lp_claim($p, 'a', 100)$$
    ],
    '[["claimed:2", "claimed:3", "claimed:4"], ["delivered:2", "delivered:3", "delivered:4"], []]'
);

-- more: a lane longer than a batch; claim_next takes the next batch.
SELECT tests.lp_case(
    'more',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1', 'x.2', 'x.3', 'x.4'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 2)$$,
        $$tests.lp_ack($p, 'a', 2)$$,
        $$tests.lp_ack($p, 'a', 2)$$
    ],
    '[["claimed:2", "claimed:3"], ["delivered:2", "delivered:3", "claimed:4", "claimed:5"], ["delivered:4", "delivered:5"]]'
);

-- local_head: a transport-only head is acknowledged locally by the claim,
-- which then leases what follows.
SELECT tests.lp_case(
    'local_head',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.t'], 'lifecycle', TRUE),
        tests.append($p || 'a', ARRAY['x.1', 'x.2'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 100)$$
    ],
    '[["local_ack:2", "claimed:3", "claimed:4"], ["delivered:3", "delivered:4"]]'
);

-- local_tail: a transport-only event after the batch; claim_next finds it
-- pending and acknowledges it locally.
SELECT tests.lp_case(
    'local_tail',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1', 'x.2']),
        tests.append($p || 'a', ARRAY['x.t'], 'lifecycle', TRUE)$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 100)$$
    ],
    '[["claimed:2", "claimed:3"], ["delivered:2", "delivered:3", "local_ack:4"]]'
);

-- reclaim: the relay claims its own frozen batch again (its lease extended).
SELECT tests.lp_case(
    'reclaim',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1', 'x.2'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 100)$$
    ],
    '[["claimed:2", "claimed:3"], ["claimed:2", "claimed:3"], ["delivered:2", "delivered:3"]]'
);

-- wakeup: a wake-up an appender left on the lane; the acknowledgement's
-- claim_next goes through the claim, which consumes it.
SELECT tests.lp_case(
    'wakeup',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_wakeup($p, 'a', 3)$$,
        $$tests.lp_ack($p, 'a', 100)$$
    ],
    '[["claimed:2"], [], ["delivered:2"]]'
);

-- blocked: a failed head; the next claim leases nothing and the lane is
-- recomputed as blocked.
SELECT tests.lp_case(
    'blocked',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1', 'x.2'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 1)$$,
        $$(SELECT jsonb_agg(f.outcome) FROM runrelay.fail_ledger(
            'r1', ARRAY[tests.eid($p || 'a', 'x.1')], '{"e": 1}', permanent => TRUE) AS f)$$,
        $$tests.lp_claim($p, 'a', 100)$$
    ],
    '[["claimed:2"], ["blocked"], []]'
);

-- bad_next: an acknowledgement asking for too large a claim_next is refused
-- and writes nothing (the events stay leased).
SELECT tests.lp_case(
    'bad_next',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 1001)$$
    ],
    '[["claimed:2"], {"error": "22023", "message": "runrelay: invalid claim_next: must be between 0 and 1000 (got 1001)"}]'
);

-- short_lease: a lease length out of range is clamped, on the short cut too.
SELECT tests.lp_case(
    'short_lease',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$tests.lp_ack($p, 'a', 100, 0)$$
    ],
    '[["claimed:2"], ["delivered:2"]]'
);

-- appended: an event appended after the batch was claimed is the next batch.
SELECT tests.lp_case(
    'appended',
    $$SELECT tests.ledger_run($p || 'a'), tests.append($p || 'a', ARRAY['x.1'])$$,
    ARRAY[
        $$tests.lp_claim($p, 'a', 100)$$,
        $$(SELECT '[]'::jsonb FROM (SELECT tests.append($p || 'a', ARRAY['x.2'])) AS a)$$,
        $$tests.lp_ack($p, 'a', 100)$$
    ],
    '[["claimed:2"], [], ["delivered:2", "claimed:3"]]'
);

SELECT * FROM finish();
ROLLBACK;
