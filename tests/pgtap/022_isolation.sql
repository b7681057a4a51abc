-- SPEC §4/§6: the §3.1 and §3.2 functions require READ COMMITTED (their
-- lock-then-recheck logic needs a fresh snapshot per statement) and raise
-- 25000 otherwise, before changing anything.
SET default_transaction_isolation = 'repeatable read';
BEGIN;
SELECT plan(16);

SELECT throws_ok($$SELECT * FROM runrelay.enqueue_run('iso-1')$$, '25000', NULL, 'enqueue_run under REPEATABLE READ');
SELECT throws_ok($$SELECT runrelay.signal_run('iso-1', 'go')$$, '25000', NULL, 'signal_run under REPEATABLE READ');
SELECT throws_ok($$SELECT runrelay.cancel_run('iso-1')$$, '25000', NULL, 'cancel_run under REPEATABLE READ');
SELECT throws_ok($$SELECT * FROM runrelay.claim_attempts('w')$$, '25000', NULL, 'claim_attempts under REPEATABLE READ');
SELECT throws_ok(
    $$SELECT * FROM runrelay.heartbeat('iso-1', 1, gen_random_uuid())$$, '25000', NULL, 'heartbeat under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.complete_attempt('iso-1', 1, gen_random_uuid())$$, '25000', NULL,
    'complete_attempt under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.complete_attempts('[]')$$, '25000', NULL, 'complete_attempts under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.fail_attempt('iso-1', 1, gen_random_uuid(), '{}')$$, '25000', NULL,
    'fail_attempt under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.suspend_attempt('iso-1', 1, gen_random_uuid(), '{"kind": "event", "name": "go"}')$$, '25000', NULL,
    'suspend_attempt under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.release_attempt('iso-1', 1, gen_random_uuid())$$, '25000', NULL,
    'release_attempt under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.prepare_waiting_failure('iso-1', 1, gen_random_uuid())$$, '25000', NULL,
    'prepare_waiting_failure under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.record_runner_terminal('iso-1', 1, '{}')$$, '25000', NULL,
    'record_runner_terminal under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT runrelay.claim_detached_terminal('iso-1', 1, gen_random_uuid())$$, '25000', NULL,
    'claim_detached_terminal under REPEATABLE READ'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.read_runner_terminal('iso-1', 1)$$, '25000', NULL, 'read_runner_terminal under REPEATABLE READ'
);
SELECT throws_ok($$SELECT * FROM runrelay.reap_expired()$$, '25000', NULL, 'reap_expired under REPEATABLE READ');
SELECT is((
    SELECT count(*) FROM runrelay.runs
    WHERE run_id = 'iso-1'
), 0::bigint, 'nothing was created');

SELECT * FROM finish();
ROLLBACK;
