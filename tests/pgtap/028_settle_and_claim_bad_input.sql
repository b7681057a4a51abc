-- Bad input to settle_and_claim (SPEC §5, §6): 22023 naming the parameter
-- (items for anything wrong inside an item, with the item's position), or
-- 54000 for items over settings.max_payload_bytes (lowered to 1024 for that case);
-- and nothing changed by a call that raises, whichever item is bad: the
-- good items before it are not settled and nothing is claimed.
BEGIN;
SELECT plan(45);

SELECT tests.start_run('sb');
SELECT runrelay.enqueue_run(run_id => 'sb_next', queue => 'sb');
CREATE TEMP TABLE big AS SELECT jsonb_build_object('pad', repeat('x', 2000)) AS doc;

-- A good completion of sb first, then p_item: the call must reject p_item
-- before settling sb.
CREATE FUNCTION tests.sb_call(
    p_item jsonb, p_worker text DEFAULT 'w1', p_queues text[] DEFAULT ARRAY['sb'], p_max_runs integer DEFAULT 1
)
RETURNS SETOF runrelay.settle_and_claim_result
LANGUAGE sql
AS $$
    SELECT * FROM runrelay.settle_and_claim(
        jsonb_build_array(
            jsonb_build_object('run_id', 'sb', 'attempt', 1, 'lease_token', tests.token('sb'))
        ) || CASE WHEN p_item IS NULL THEN '[]'::jsonb ELSE jsonb_build_array(p_item) END,
        p_worker, p_queues, p_max_runs
    );
$$;

-- An item for run x (no such run: the call would answer fence_lost) with
-- the given fields.
CREATE FUNCTION tests.sb_item(p_fields jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object('run_id', 'x', 'attempt', 1, 'lease_token', gen_random_uuid()) || p_fields;
$$;

-- Each bad call: 22023 (or the given SQLSTATE) whose COLUMN is the
-- parameter and whose message names it.
CREATE FUNCTION tests.sb_rejects(p_call text, p_parameter text, p_description text, p_state text DEFAULT '22023')
RETURNS text
LANGUAGE plpgsql
AS $$
BEGIN
    BEGIN
        EXECUTE p_call;
    EXCEPTION WHEN OTHERS THEN
        DECLARE
            v_state text;
            v_column text;
            v_message text;
        BEGIN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_column = COLUMN_NAME, v_message = MESSAGE_TEXT;
            RETURN ok(
                v_state = p_state AND v_column = p_parameter AND strpos(v_message, p_parameter) > 0,
                p_description
            ) || CASE WHEN v_state = p_state AND v_column = p_parameter THEN '' ELSE
                E'\n# got ' || v_state || ' column ' || coalesce(v_column, 'null') || ': ' || v_message END;
        END;
    END;
    RETURN ok(FALSE, p_description) || E'\n# the call did not raise';
END;
$$;

-- The arguments besides items.
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, NULL)$$, 'worker', 'null worker');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, '')$$, 'worker', 'blank worker');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, repeat('w', 201))$$, 'worker', '201-character worker');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY['sb'], -1)$$, 'max_runs', 'max_runs -1');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY['sb'], 1001)$$, 'max_runs', 'max_runs 1001');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY['sb'], NULL)$$, 'max_runs', 'null max_runs');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', '{}')$$, 'queues', 'an empty queue list');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY['sb', ''])$$, 'queues', 'a blank queue name');
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY['sb', NULL], 0)$$, 'queues', 'a null queue name, even with max_runs 0'
);
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(NULL, 'w1', ARRAY[['a'], ['b']])$$, 'queues', 'a two-dimensional queue list');

-- items as a whole.
SELECT tests.sb_rejects($$SELECT * FROM runrelay.settle_and_claim(NULL, 'w1')$$, 'items', 'null items');
SELECT tests.sb_rejects($$SELECT * FROM runrelay.settle_and_claim('{}', 'w1')$$, 'items', 'items an object');
SELECT tests.sb_rejects(
    $$SELECT * FROM runrelay.settle_and_claim((SELECT jsonb_agg(jsonb_build_object('n', i)) FROM generate_series(1, 1001) AS i), 'w1')$$,
    'items', '1001 items'
);
CREATE TEMP TABLE cap AS SELECT max_payload_bytes AS bytes FROM runrelay.settings;
UPDATE runrelay.settings SET max_payload_bytes = 1024;
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item(jsonb_build_object('result', (SELECT doc FROM big))))$$,
    'items', 'items over the payload cap', '54000'
);
UPDATE runrelay.settings SET max_payload_bytes = (SELECT bytes FROM cap);

-- The fence of an item.
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call('1')$$, 'items', 'an item that is not an object');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{}') - 'run_id')$$, 'items', 'an item without run_id');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{}') - 'attempt')$$, 'items', 'an item without attempt');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{}') - 'lease_token')$$, 'items', 'an item without lease_token');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"run_id": ""}'))$$, 'items', 'a blank run_id');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"attempt": "1"}'))$$, 'items', 'an attempt given as a string');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"attempt": 0}'))$$, 'items', 'attempt 0');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"attempt": 1.5}'))$$, 'items', 'a fractional attempt');
SELECT
    tests.sb_rejects(
        $$SELECT * FROM tests.sb_call(tests.sb_item('{"lease_token": "nope"}'))$$, 'items', 'a lease_token that is not a uuid'
    );
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"run_id": "sb"}'))$$, 'items', 'a repeated run_id');

-- The op and its fields.
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "finish"}'))$$, 'items', 'an unknown op');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": null}'))$$, 'items', 'a null op');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": 1}'))$$, 'items', 'an op that is not a string');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"colour": "red"}'))$$, 'items', 'an unknown field');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"error": {}}'))$$, 'items', 'error on a complete item');
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "fail", "error": {}, "result": {}}'))$$, 'items', 'result on a fail item'
);
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "release", "final_events": []}'))$$, 'items', 'final_events on a release item'
);
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "suspend", "wait": {"kind": "event", "name": "go"}, "reason": "r"}'))$$,
    'items', 'reason on a suspend item'
);
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"result": null}'))$$, 'items', 'a null result');
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"final_events": [{"lane": "lifecycle"}]}'))$$, 'items', 'an event without a type'
);
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"final_events": {}}'))$$, 'items', 'final_events not an array');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "fail"}'))$$, 'items', 'a fail item without error');
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "fail", "error": null}'))$$, 'items', 'a null error');
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "fail", "error": {}, "retry_at": "soon"}'))$$, 'items', 'retry_at not a timestamp'
);
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "fail", "error": {}, "retry_at": "infinity"}'))$$, 'items', 'an infinite retry_at'
);
SELECT tests.sb_rejects($$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "suspend"}'))$$, 'items', 'a suspend item without wait');
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "suspend", "wait": {"kind": "nap"}}'))$$, 'items', 'an unknown wait kind'
);
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item('{"op": "release", "run_at": 5}'))$$, 'items', 'a run_at that is a number'
);
SELECT tests.sb_rejects(
    $$SELECT * FROM tests.sb_call(tests.sb_item(jsonb_build_object('op', 'release', 'reason', repeat('r', 2001))))$$,
    'items', 'a 2001-character reason'
);

-- Nothing was changed by any call that raised.
SELECT is(tests.state('sb'), 'running:running', 'the good item before every bad one was not settled');
SELECT is(tests.state('sb_next'), 'queued:', 'nothing was claimed');

SELECT * FROM finish();
ROLLBACK;
