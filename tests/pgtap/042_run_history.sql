-- A run's ledger rows go with the run (schema/08_run_history.sql): the
-- ledger tables have no foreign key to runs, and triggers on runs delete
-- or truncate their events, deliveries, lanes and wake-ups as ON DELETE
-- CASCADE did. attempts, signals and steps keep their foreign keys. And a
-- batch's acknowledgement is one delivery row, never an update of its
-- events, so ledger_events packs its pages full.
BEGIN;
SELECT plan(13);

SELECT is(
    (
        SELECT array_agg(c.conrelid::regclass::text ORDER BY c.conrelid::regclass::text)
        FROM pg_constraint AS c
        WHERE c.contype = 'f' AND c.connamespace = 'runrelay'::regnamespace
    ),
    ARRAY['runrelay.attempts', 'runrelay.signals', 'runrelay.steps'],
    'only attempts, signals and steps reference runs by a foreign key'
);

SELECT tests.ledger_run('h1');
SELECT tests.ledger_run('h2');
SELECT tests.ledger_run('h3');
SELECT tests.append('h1', ARRAY['a', 'b'], 'observability');
SELECT tests.append('h2', ARRAY['a'], 'observability');
SELECT tests.append('h3', ARRAY['a'], 'observability');
-- A delivery row more each for h1 and h2 (tests.ledger_run delivered every
-- run's run.queued): their observability events delivered.
SELECT (
    SELECT count(*) FROM runrelay.ack_ledger(
        relay => 'x', run_id => r.run_id,
        event_ids => (
            SELECT array_agg(c.event_id)
            FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => r.run_id, max_events => 10, batch => TRUE) AS c
        )
    )
)
FROM (VALUES ('h1'), ('h2')) AS r (run_id);
-- A wake-up row, as an append leaves when a relay holds the lane.
INSERT INTO runrelay.ledger_wakeups (run_id, lane, first_seq, created_at)
VALUES ('h1', 'observability', 2, now()), ('h2', 'observability', 2, now());

CREATE FUNCTION pg_temp.rows_of(p_run_ids text[])
RETURNS bigint[]
LANGUAGE sql
AS $$
    SELECT ARRAY[
        (
            SELECT count(*) FROM runrelay.ledger_events AS l
            WHERE l.run_id = ANY(p_run_ids)
        ),
        (
            SELECT count(*) FROM runrelay.ledger_deliveries AS d
            WHERE d.run_id = ANY(p_run_ids)
        ),
        (
            SELECT count(*) FROM runrelay.ledger_lanes AS ll
            WHERE ll.run_id = ANY(p_run_ids)
        ),
        (
            SELECT count(*) FROM runrelay.ledger_wakeups AS w
            WHERE w.run_id = ANY(p_run_ids)
        )
    ];
$$;

SELECT is(pg_temp.rows_of(ARRAY['h1']), ARRAY[3, 2, 2, 1]::bigint[], 'h1 has events, deliveries, lanes and a wake-up');

DELETE FROM runrelay.runs
WHERE run_id = 'h1';
SELECT is(pg_temp.rows_of(ARRAY['h1']), ARRAY[0, 0, 0, 0]::bigint[], 'deleting a run deletes its events, deliveries, lanes and wake-up');
SELECT is(pg_temp.rows_of(ARRAY['h2', 'h3']), ARRAY[4, 3, 4, 1]::bigint[], '... and no other run''s');

DELETE FROM runrelay.runs
WHERE run_id IN ('h2', 'h3');
SELECT is(pg_temp.rows_of(ARRAY['h2', 'h3']), ARRAY[0, 0, 0, 0]::bigint[], 'one statement deleting two runs deletes both histories');

-- The triggers are part of the schema. No role of the install may delete
-- or truncate runs, so they run as the tables' owner, as the cascade did.
SELECT is(
    (
        SELECT array_agg(t.tgname::text ORDER BY t.tgname) FROM pg_trigger AS t
        WHERE t.tgrelid = 'runrelay.runs'::regclass AND NOT t.tgisinternal
    ),
    ARRAY['runs_deleted', 'runs_truncated'],
    'runs carries the two history triggers'
);
SELECT is(
    (
        SELECT count(*) FROM pg_roles AS r
        WHERE
            r.rolname LIKE 'runrelay\_%'
            AND (
                has_table_privilege(r.oid, 'runrelay.runs', 'DELETE')
                OR has_table_privilege(r.oid, 'runrelay.runs', 'TRUNCATE')
            )
    ),
    0::bigint,
    'no runrelay role may delete or truncate runs'
);

-- TRUNCATE runs empties the ledger tables, named with them or alone.
SELECT tests.ledger_run('t1');
SELECT tests.append('t1', ARRAY['a'], 'observability');
TRUNCATE runrelay.runs, runrelay.ledger_events, runrelay.ledger_lanes CASCADE;
SELECT is(pg_temp.rows_of(ARRAY['t1']), ARRAY[0, 0, 0, 0]::bigint[], 'TRUNCATE naming runs and ledger tables together');
SELECT tests.ledger_run('t2');
SELECT tests.append('t2', ARRAY['a'], 'observability');
SELECT count(*) FROM runrelay.ack_ledger(
    relay => 'x', run_id => 't2',
    event_ids => (
        SELECT array_agg(c.event_id) FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 't2') AS c
    )
);
SELECT is(pg_temp.rows_of(ARRAY['t2']), ARRAY[2, 2, 2, 0]::bigint[], 't2 has events, deliveries and lanes');
TRUNCATE runrelay.runs CASCADE;
SELECT is(pg_temp.rows_of(ARRAY['t2']), ARRAY[0, 0, 0, 0]::bigint[], 'TRUNCATE runs CASCADE empties the ledger tables');

-- A batch of 100 is acknowledged with one delivery row and no update of its
-- events, so nothing needs the room a lower fillfactor would keep free on
-- the events' pages.
SELECT is(
    (
        SELECT coalesce(c.reloptions, '{}') @> ARRAY['fillfactor=50'] FROM pg_class AS c
        WHERE c.oid = 'runrelay.ledger_events'::regclass
    ),
    FALSE,
    'ledger_events keeps no page room for deliveries'
);
SELECT tests.ledger_run('f1');
SELECT tests.append('f1', array_agg('e' || i), 'observability') FROM generate_series(1, 100) AS i;
CREATE TEMPORARY TABLE before_ack AS
SELECT pg_stat_get_xact_tuples_updated('runrelay.ledger_events'::regclass) AS updated;
SELECT is(
    (
        SELECT count(*)
        FROM
            runrelay.ack_ledger(
                relay => 'x', run_id => 'f1',
                event_ids => (
                    SELECT array_agg(c.event_id)
                    FROM runrelay.claim_ledger(relay => 'x', lane => 'observability', run_id => 'f1', max_events => 100, batch => TRUE) AS c
                )
            )
        WHERE kind = 'delivered'
    ),
    100::bigint,
    'a batch of 100 is claimed and acknowledged'
);
SELECT is(
    (SELECT pg_stat_get_xact_tuples_updated('runrelay.ledger_events'::regclass) - h.updated FROM before_ack AS h),
    0::bigint,
    '... which updates none of its events'
);

SELECT * FROM finish();
ROLLBACK;
