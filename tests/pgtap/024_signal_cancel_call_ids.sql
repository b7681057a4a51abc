-- signal_run and cancel_run with a call_id (SPEC §3 "Replays are exact"):
-- a repeat answers the first outcome and writes nothing, also after the
-- stored signal was consumed or the marker applied; the same id with other
-- arguments, another run or the other function raises 22023 naming call_id
-- and changes nothing; outcomes that changed nothing leave no record; the
-- nil uuid is refused; calls without a call_id behave as before.
BEGIN;
SELECT plan(53);

-- The signatures: call_id is the new last parameter, with a default, and the
-- old calls keep working (one function each, no overload left behind).
SELECT has_function('runrelay', 'signal_run', ARRAY['text', 'text', 'jsonb', 'uuid'], 'signal_run takes call_id last');
SELECT has_function('runrelay', 'cancel_run', ARRAY['text', 'text', 'uuid'], 'cancel_run takes call_id last');
SELECT is(
    (
        SELECT count(*) FROM pg_proc
        WHERE pronamespace = 'runrelay'::regnamespace AND proname IN ('signal_run', 'cancel_run')
    ),
    2::bigint, 'one signal_run and one cancel_run'
);

-- resumed: the run waited for the signal.
SELECT tests.start_waiting('i1', '{"kind": "event", "name": "go"}');
SELECT is(
    runrelay.signal_run('i1', 'go', '{"v": 1}', '11111111-1111-4111-8111-111111111111'), 'resumed',
    'a signal with a call_id to a waiting run answers resumed'
);
SELECT results_eq(
    $$SELECT function_name, run_id, outcome FROM runrelay.calls WHERE call_id = '11111111-1111-4111-8111-111111111111'$$,
    $$VALUES ('signal_run', 'i1', 'resumed')$$,
    'the call and its outcome are recorded'
);
SELECT tests.remember('i1');
SELECT is(
    runrelay.signal_run('i1', 'go', '{"v": 1}', '11111111-1111-4111-8111-111111111111'), 'resumed',
    'its repeat answers resumed (not stored)'
);
SELECT is(tests.everything(), tests.seen('i1'), 'the repeat wrote nothing: no stored signal');
SELECT is(
    runrelay.signal_run(run_id => 'i1', name => 'go', payload => '{"v": 1}', call_id => '11111111-1111-4111-8111-111111111111'),
    'resumed', 'named arguments, the same answer'
);
SELECT runrelay.complete_attempt('i1', 2, (tests.claim_run('i1')).lease_token);
SELECT is(
    runrelay.signal_run('i1', 'go', '{"v": 1}', '11111111-1111-4111-8111-111111111111'), 'resumed',
    'after the run completed the repeat still answers resumed (not terminal)'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.ledger
        WHERE run_id = 'i1' AND type = 'run.resumed'
    ), 1::bigint,
    'run.resumed was emitted once'
);

-- stored: kept for a later wait; consumed; the repeat still answers stored.
SELECT tests.start_run('i2');
SELECT is(
    runrelay.signal_run('i2', 'go', '{"v": 2}', '22222222-2222-4222-8222-222222222222'), 'stored',
    'a signal with a call_id to a running run answers stored'
);
SELECT tests.remember('i2');
SELECT is(
    runrelay.signal_run('i2', 'go', '{"v": 2}', '22222222-2222-4222-8222-222222222222'), 'stored',
    'its repeat answers stored'
);
SELECT is(tests.everything(), tests.seen('i2'), 'the repeat wrote nothing');
SELECT is((
    SELECT count(*) FROM runrelay.signals
    WHERE run_id = 'i2'
), 1::bigint, 'one signal is stored');
SELECT is(
    runrelay.suspend_attempt('i2', 1, tests.token('i2'), '{"kind": "event", "name": "go"}'), 'resumed',
    'the next wait consumes it'
);
SELECT is(
    runrelay.signal_run('i2', 'go', '{"v": 2}', '22222222-2222-4222-8222-222222222222'), 'stored',
    'a repeat after the signal was consumed answers stored'
);
SELECT is((
    SELECT count(*) FROM runrelay.signals
    WHERE run_id = 'i2'
), 0::bigint, 'and stores nothing again');

-- terminal: the signal applied a pending cancellation.
SELECT tests.start_run('i3');
SELECT tests.mark_cancel('i3', 'stop');
SELECT is(
    runrelay.signal_run('i3', 'go', '{}', '33333333-3333-4333-8333-333333333333'), 'terminal',
    'a signal that applies a pending cancellation answers terminal'
);
SELECT is(tests.state('i3'), 'cancelled:cancelled', 'the run is cancelled');
SELECT is(
    (
        SELECT outcome FROM runrelay.calls
        WHERE call_id = '33333333-3333-4333-8333-333333333333'
    ), 'terminal',
    'that call changed something, so it is recorded'
);
SELECT tests.remember('i3');
SELECT is(runrelay.signal_run('i3', 'go', '{}', '33333333-3333-4333-8333-333333333333'), 'terminal', 'its repeat answers terminal');
SELECT is(tests.everything(), tests.seen('i3'), 'the repeat wrote nothing');

-- Outcomes that changed nothing leave no record.
SELECT is(runrelay.signal_run('i3', 'go', '{}', '44444444-4444-4444-8444-444444444444'), 'terminal', 'a signal to an ended run: terminal');
SELECT is(runrelay.signal_run('i-none', 'go', '{}', '55555555-5555-4555-8555-555555555555'), 'not_found', 'to no run: not_found');
SELECT is(
    (
        SELECT count(*) FROM runrelay.calls
        WHERE call_id IN ('44444444-4444-4444-8444-444444444444', '55555555-5555-4555-8555-555555555555')
    ),
    0::bigint, 'neither is recorded'
);
SELECT tests.start_run('i-none');
SELECT is(
    runrelay.signal_run('i-none', 'go', '{}', '55555555-5555-4555-8555-555555555555'), 'stored',
    'so a repeat of a not_found call once the run exists is decided afresh'
);

-- The same id for another call: 22023 naming call_id, nothing changed.
SELECT tests.remember('mismatch');
SELECT throws_ok(
    $$SELECT runrelay.signal_run('i2', 'go', '{"v": 3}', '22222222-2222-4222-8222-222222222222')$$,
    '22023', NULL, 'the same call_id with another payload is refused'
);
SELECT throws_like(
    $$SELECT runrelay.signal_run('i2', 'went', '{"v": 2}', '22222222-2222-4222-8222-222222222222')$$,
    '%invalid call_id%other name or payload%', 'the same call_id with another name is refused, naming call_id'
);
SELECT throws_like(
    $$SELECT runrelay.signal_run('i1', 'go', '{"v": 2}', '22222222-2222-4222-8222-222222222222')$$,
    '%invalid call_id%another run%', 'the same call_id for another run is refused'
);
SELECT throws_like(
    $$SELECT runrelay.cancel_run('i2', NULL, '22222222-2222-4222-8222-222222222222')$$,
    '%invalid call_id%signal_run%', 'a signal''s call_id passed to cancel_run is refused'
);
SELECT throws_ok(
    $$SELECT runrelay.signal_run('i2', 'go', '{"v": 2}', '00000000-0000-0000-0000-000000000000')$$,
    '22023', NULL, 'signal_run refuses the nil uuid'
);
SELECT throws_ok(
    $$SELECT runrelay.signal_run('', 'go', '{}', '66666666-6666-4666-8666-666666666666')$$,
    '22023', NULL, 'a bad run_id is still refused first'
);
SELECT is(tests.everything(), tests.seen('mismatch'), 'the refused calls changed nothing');

-- Without a call_id nothing is recorded and a repeat is a new signal.
SELECT tests.start_run('i4');
SELECT is(runrelay.signal_run('i4', 'go'), 'stored', 'the three-argument call still works');
SELECT is(runrelay.signal_run('i4', 'go', '{}', NULL), 'stored', 'as does a null call_id');
SELECT is((
    SELECT count(*) FROM runrelay.signals
    WHERE run_id = 'i4'
), 2::bigint, 'without call_id both are stored');
SELECT is((
    SELECT count(*) FROM runrelay.calls
    WHERE run_id = 'i4'
), 0::bigint, 'and nothing is recorded');

-- cancel_run: cancelled; the repeat answers cancelled, not already_terminal.
SELECT runrelay.enqueue_run(run_id => 'c1', queue => 'c1');
SELECT is(
    runrelay.cancel_run('c1', 'no longer needed', '77777777-7777-4777-8777-777777777777'), 'cancelled',
    'a cancel with a call_id answers cancelled'
);
SELECT tests.remember('c1');
SELECT is(
    runrelay.cancel_run('c1', 'no longer needed', '77777777-7777-4777-8777-777777777777'), 'cancelled',
    'its repeat answers cancelled'
);
SELECT is(tests.everything(), tests.seen('c1'), 'the repeat wrote nothing');
SELECT is(runrelay.cancel_run('c1', 'no longer needed'), 'already_terminal', 'a cancel without call_id: already_terminal');
SELECT is(
    runrelay.cancel_run('c1', 'no longer needed', '88888888-8888-4888-8888-888888888888'), 'already_terminal',
    'a new call_id: already_terminal'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.calls
        WHERE call_id = '88888888-8888-4888-8888-888888888888'
    ), 0::bigint,
    'already_terminal changed nothing and is not recorded'
);

-- cancel_requested: recorded; the repeat answers it after the marker was applied.
SELECT tests.start_run('c2');
SELECT tests.set_key('c2', 'ikey');
SELECT tests.hold_key('ikey');
SELECT is(
    runrelay.cancel_run('c2', 'stop', '99999999-9999-4999-8999-999999999999'), 'cancel_requested',
    'a cancel with a call_id and the locks busy answers cancel_requested'
);
SELECT tests.release_key();
SELECT is((SELECT outcome FROM runrelay.heartbeat('c2', 1, tests.token('c2'))), 'cancelled', 'a writer applies the marker');
SELECT tests.remember('c2');
SELECT is(
    runrelay.cancel_run('c2', 'stop', '99999999-9999-4999-8999-999999999999'), 'cancel_requested',
    'the repeat answers cancel_requested after the marker was applied'
);
SELECT is(tests.everything(), tests.seen('c2'), 'the repeat wrote nothing');

-- cancel_run mismatches, bad input.
SELECT throws_like(
    $$SELECT runrelay.cancel_run('c2', 'another reason', '99999999-9999-4999-8999-999999999999')$$,
    '%invalid call_id%other reason%', 'the same call_id with another reason is refused, naming call_id'
);
SELECT throws_ok(
    $$SELECT runrelay.cancel_run('c2', NULL, '99999999-9999-4999-8999-999999999999')$$,
    '22023', NULL, 'a null reason differs from a given one'
);
SELECT throws_like(
    $$SELECT runrelay.cancel_run('c1', 'stop', '99999999-9999-4999-8999-999999999999')$$,
    '%invalid call_id%another run%', 'the same call_id for another run is refused'
);
SELECT throws_like(
    $$SELECT runrelay.signal_run('c2', 'go', '{}', '99999999-9999-4999-8999-999999999999')$$,
    '%invalid call_id%cancel_run%', 'a cancel''s call_id passed to signal_run is refused'
);
SELECT throws_ok(
    $$SELECT runrelay.cancel_run('c2', 'stop', '00000000-0000-0000-0000-000000000000')$$,
    '22023', NULL, 'cancel_run refuses the nil uuid'
);
SELECT is(tests.everything(), tests.seen('c2'), 'the refused calls changed nothing');

SELECT * FROM finish();
ROLLBACK;
