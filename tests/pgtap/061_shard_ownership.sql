-- Shard ownership: with no shard_ownership row (an unsharded install) every
-- run_id is created; with one, a new run_id whose partition (the first 32
-- bits of the MD5 of its routing key, masked by partition_count - 1) is not
-- among the row's partitions raises 22023 naming the item, and nothing is
-- written; a repeat of a run that exists answers it; the owned ones are
-- created.
BEGIN;
SELECT plan(18);

-- Two partitions; this install will be shard 0, owning partition 0.
CREATE TEMP TABLE ids AS
SELECT
    (
        SELECT 'own-' || g.n FROM generate_series(1, 100) AS g (n)
        WHERE ('x' || left(md5('own-' || g.n), 8))::bit(32)::integer & 1 = 0
        ORDER BY g.n LIMIT 1
    ) AS mine,
    (
        SELECT 'own-' || g.n FROM generate_series(1, 100) AS g (n)
        WHERE ('x' || left(md5('own-' || g.n), 8))::bit(32)::integer & 1 = 1
        ORDER BY g.n LIMIT 1
    ) AS theirs;

-- Unsharded: no row, no check.
SELECT results_eq(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.theirs FROM ids AS i)),
    format('VALUES (%L, %L, TRUE)', (SELECT i.theirs FROM ids AS i), 'queued'),
    'without a shard_ownership row any run_id is created'
);

INSERT INTO runrelay.shard_ownership (shard, partition_count, partitions) VALUES (0, 2, '{0}');
CREATE TEMP TABLE before AS
SELECT
    (SELECT count(*) FROM runrelay.runs) AS runs,
    (SELECT count(*) FROM runrelay.ledger_events) AS events;

SELECT throws_ok(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.theirs || '-x{' || i.theirs || '}' FROM ids AS i)),
    '22023', NULL, 'enqueue_run: a new run_id routed by its tag to another shard is refused'
);
SELECT throws_ok(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.theirs || '{}' FROM ids AS i)),
    '22023', NULL, 'enqueue_run: an empty tag routes by the whole id, another shard''s'
);
SELECT throws_ok(
    format(
        'SELECT * FROM runrelay.enqueue_runs(%L)',
        (
            SELECT jsonb_build_array(jsonb_build_object('run_id', i.mine), jsonb_build_object('run_id', 'x{' || i.theirs || '}'))
            FROM ids AS i
        )
    ),
    '22023', NULL, 'enqueue_runs: one item of another shard refuses the whole call'
);
SELECT is(
    (SELECT row(b.runs, b.events) FROM before AS b),
    (SELECT row((SELECT count(*) FROM runrelay.runs), (SELECT count(*) FROM runrelay.ledger_events))),
    'the refused calls wrote nothing'
);

-- The error names the item and hints where to go.
CREATE FUNCTION pg_temp.refusal(p_call text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_column text;
    v_hint text;
BEGIN
    EXECUTE p_call;
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value THEN
    GET STACKED DIAGNOSTICS v_column = COLUMN_NAME, v_hint = PG_EXCEPTION_HINT;
    RETURN ARRAY[v_column, v_hint];
END;
$$;
SELECT is(
    (pg_temp.refusal(format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.theirs || '-y{' || i.theirs || '}' FROM ids AS i))))[1],
    'run_id', 'enqueue_run names run_id'
);
SELECT is(
    (
        pg_temp.refusal(format(
            'SELECT * FROM runrelay.enqueue_runs(%L)',
            (
                SELECT jsonb_build_array(jsonb_build_object('run_id', i.mine), jsonb_build_object('run_id', 'z{' || i.theirs || '}'))
                FROM ids AS i
            )
        ))
    )[1],
    'items[1].run_id', 'enqueue_runs names the item'
);
SELECT matches(
    (pg_temp.refusal(format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT 'w{' || i.theirs || '}' FROM ids AS i))))[2],
    'shard_for', 'the hint says how to find the owning shard'
);

-- Repeats of a run that exists answer it, in both calls.
SELECT results_eq(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.theirs FROM ids AS i)),
    format('VALUES (%L, %L, FALSE)', (SELECT i.theirs FROM ids AS i), 'queued'),
    'enqueue_run: a repeat of an existing run answers it'
);
SELECT results_eq(
    format(
        'SELECT * FROM runrelay.enqueue_runs(%L)',
        (
            SELECT jsonb_build_array(jsonb_build_object('run_id', i.theirs), jsonb_build_object('run_id', i.mine || '{' || i.mine || '}'))
            FROM ids AS i
        )
    ),
    format(
        'VALUES (%L, %L, FALSE), (%L, %L, TRUE)',
        (SELECT i.theirs FROM ids AS i), 'queued', (SELECT i.mine || '{' || i.mine || '}' FROM ids AS i), 'queued'
    ),
    'enqueue_runs: a repeat of an existing run answers it beside a new owned run'
);

-- Owned run_ids are created.
SELECT results_eq(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.mine FROM ids AS i)),
    format('VALUES (%L, %L, TRUE)', (SELECT i.mine FROM ids AS i), 'queued'),
    'enqueue_run: an owned run_id is created'
);

-- A schedule on a shard must name a {tag} that routes here: its runs are
-- schedule:<name>:<slot>, and without a tag each slot would route by its
-- whole run_id, to any shard.
SELECT throws_ok(
    $$SELECT runrelay.upsert_schedule('nightly', '0 3 * * *')$$,
    '22023', NULL, 'upsert_schedule on a shard: a name without a {tag} is refused'
);
SELECT throws_ok(
    format($$SELECT runrelay.upsert_schedule(%L, '0 3 * * *')$$, (SELECT 'nightly{' || i.theirs || '}' FROM ids AS i)),
    '22023', NULL, 'upsert_schedule on a shard: a {tag} of another shard is refused'
);
SELECT is(
    (SELECT count(*) FROM runrelay.schedules),
    0::bigint,
    'the refused declarations wrote nothing'
);
SELECT is(
    runrelay.upsert_schedule((SELECT 'nightly{' || i.mine || '}' FROM ids AS i), '0 3 * * *'),
    'created',
    'upsert_schedule on a shard: a {tag} of this shard is declared'
);
UPDATE runrelay.schedules SET next_slot_at = now() - interval '1 minute';
SELECT is(
    (SELECT count(*) FROM runrelay.enqueue_due_schedules()),
    1::bigint,
    'its due slot is enqueued on this shard'
);

-- A shard that owns no partition creates no run.
UPDATE runrelay.shard_ownership SET partitions = '{}';
SELECT throws_ok(
    format('SELECT * FROM runrelay.enqueue_run(%L)', (SELECT i.mine || '-2{' || i.mine || '}' FROM ids AS i)),
    '22023', NULL, 'a shard without partitions refuses every new run_id'
);

-- No role may read or change the map.
SET LOCAL ROLE runrelay_admin;
SELECT throws_ok(
    'UPDATE runrelay.shard_ownership SET partitions = ''{0,1}''', '42501', NULL,
    'the admin cannot change the shard''s ownership'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
