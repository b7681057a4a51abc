-- The data model of SPEC §2 and the privileges of SPEC §5.
BEGIN;
SELECT plan(24);

SELECT has_schema('runrelay');
SELECT has_table('runrelay', 'runs', 'runs exists');
SELECT has_table('runrelay', 'attempts', 'attempts exists');
SELECT has_table('runrelay', 'cancellations', 'cancellations exists');
SELECT has_table('runrelay', 'signals', 'signals exists');
SELECT has_view('runrelay', 'ledger', 'ledger exists (a view of ledger_events with each event''s lease read from its lane)');
SELECT col_is_pk('runrelay', 'runs', 'run_id', 'runs keyed by run_id');
SELECT col_is_pk('runrelay', 'attempts', ARRAY['run_id', 'attempt'], 'attempts keyed by run and number');
SELECT col_is_pk('runrelay', 'ledger_events', 'event_id', 'ledger keyed by event_id');
SELECT col_type_is('runrelay', 'attempts', 'lease_token', 'uuid', 'lease tokens are uuids');
SELECT col_type_is('runrelay', 'ledger', 'seq', 'bigint', 'seq is bigint');
SELECT index_is_unique(
    'runrelay', 'ledger_events', 'ledger_delivery_key_unique',
    'explicit delivery keys are unique (default keys are by construction: 068_delivery_keys.sql)'
);

SELECT throws_ok(
    $$SELECT tests.insert_run('bad-status', 'exploded')$$,
    '23514', NULL, 'an unknown run status is rejected'
);
SELECT throws_ok(
    $$SELECT tests.insert_run('no-finish', 'failed')$$,
    '23514', NULL, 'a terminal run without finished_at is rejected'
);
SELECT lives_ok($$SELECT tests.insert_run('ok')$$, 'a legal queued run is accepted');

SELECT has_role('runrelay_producer');
SELECT has_role('runrelay_worker');
SELECT has_role('runrelay_relay');
SELECT has_role('runrelay_admin');

SELECT table_privs_are('runrelay', 'runs', 'runrelay_worker', ARRAY[]::text[], 'workers have no privilege on runs');
SELECT table_privs_are('runrelay', 'ledger', 'runrelay_relay', ARRAY[]::text[], 'relays have no privilege on the ledger');
SELECT table_privs_are('runrelay', 'runs', 'public', ARRAY[]::text[], 'PUBLIC has no privilege on runs');

SET LOCAL ROLE runrelay_producer;
SELECT throws_ok(
    $$INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts, created_at, updated_at)
      VALUES ('sneaky', 'default', 'queued', '{}', now(), 3, now(), now())$$,
    '42501', NULL, 'a producer cannot insert runs directly'
);
RESET ROLE;

SELECT function_privs_are(
    'runrelay', '_now', ARRAY[]::text[], 'runrelay_worker', ARRAY[]::text[],
    'internal helpers are not executable by roles'
);

SELECT * FROM finish();
ROLLBACK;
