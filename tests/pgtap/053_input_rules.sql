-- The input rules (docs/security.md#input-rules): identifiers refuse control
-- characters and Unicode blanks and keep other non-ASCII text; the run.
-- event types are the engine's and schedule: run ids the schedules', so
-- producers and workers get 22023 for them; enqueue_runs is capped as a
-- whole (54000); an error quotes at most a short, escaped prefix of a value.
BEGIN;
SELECT plan(32);

SELECT tests.start_run('ir');
SELECT runrelay.enqueue_run(run_id => 'other');

-- Identifiers.
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => E'a\x1b[2Jb')$$, '22023', NULL, 'enqueue_run: escape sequence in run_id'
);
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => E'x\x7f')$$, '22023', NULL, 'enqueue_run: DEL in run_id');
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => E'x\u0085')$$, '22023', NULL, 'enqueue_run: C1 NEL in run_id');
SELECT throws_ok($$SELECT runrelay.enqueue_run(run_id => E'\u00a0')$$, '22023', NULL, 'enqueue_run: NBSP-only run_id');
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b', queue => E'\u3000\u2003')$$, '22023', NULL,
    'enqueue_run: queue of ideographic and em spaces'
);
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'b6', concurrency_key => E'k\tk')$$, '22023', NULL,
    'enqueue_run: tab in concurrency_key'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "ok"}, {"run_id": "\u001b]0;x\u0007"}]')$$, '22023', NULL,
    'enqueue_runs: control characters in an item''s run_id'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => E'w\x07')$$, '22023', NULL, 'claim_attempts: BEL in worker'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => ARRAY[E'\ufeff'])$$, '22023', NULL,
    'claim_attempts: a BOM-only queue name'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => E'\u202f')$$, '22023', NULL, 'claim_ledger: blank relay (NNBSP)'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.signal_run(run_id => 'ir', name => E'sig\x1b')$$, '22023', NULL,
    'signal_run: escape in the signal name'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.upsert_schedule(name => E'n\x0d', cron => '* * * * *', time_zone => 'UTC')$$,
    '22023', NULL, 'upsert_schedule: carriage return in the name'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.pause_queue(queue => E'\x1b[0m')$$, '22023', NULL, 'pause_queue: escape in the queue'
);
SELECT is((SELECT count(*) FROM runrelay.runs), 2::bigint, 'no refused identifier created a run');
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'café', queue => '注文', concurrency_key => 'clé-1')$$,
    'enqueue_run: non-ASCII identifiers are accepted'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "注文-1", "queue": "キュー"}]')$$,
    'enqueue_runs: non-ASCII identifiers are accepted'
);

-- Reserved namespaces: run. event types.
SELECT throws_ok(
    $$SELECT * FROM runrelay.append_events('other', '[{"type": "run.completed"}]')$$, '22023', NULL,
    'append_events: run.completed is the engine''s'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.append_events('other', '[{"type": "ok"}, {"type": "run.anything"}]')$$, '22023', NULL,
    'append_events: any run. type is the engine''s'
);
SELECT throws_ok(
    format(
        $$SELECT runrelay.complete_attempt('ir', 1, %L, '{}', '[{"type": "run.completed"}]')$$, tests.token('ir')
    ),
    '22023', NULL, 'complete_attempt: final_events may not forge run.completed'
);
SELECT throws_ok(
    format(
        $$SELECT runrelay.fail_attempt('ir', 1, %L, '{}', final_events => '[{"type": "run.failed"}]')$$,
        tests.token('ir')
    ),
    '22023', NULL, 'fail_attempt: final_events may not forge run.failed'
);
SELECT throws_ok(
    format(
        $$SELECT runrelay.suspend_attempt('ir', 1, %L, '{"kind": "sleep", "until": "2100-01-01T00:00:00Z"}',
            final_events => '[{"type": "run.completed"}]')$$,
        tests.token('ir')
    ),
    '22023', NULL, 'suspend_attempt: final_events may not forge run.completed'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM runrelay.complete_attempts(jsonb_build_array(jsonb_build_object(
            'run_id', 'ir', 'attempt', 1, 'lease_token', %L, 'final_events', '[{"type": "run.completed"}]'::jsonb)))$$,
        tests.token('ir')
    ),
    '22023', NULL, 'complete_attempts: final_events may not forge run.completed'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM runrelay.settle_and_claim(worker => 'w1', items => jsonb_build_array(jsonb_build_object(
            'op', 'complete', 'run_id', 'ir', 'attempt', 1, 'lease_token', %L,
            'final_events', '[{"type": "run.completed"}]'::jsonb)))$$,
        tests.token('ir')
    ),
    '22023', NULL, 'settle_and_claim: final_events may not forge run.completed'
);
SELECT is(
    (
        SELECT r.status FROM runrelay.runs AS r
        WHERE r.run_id = 'ir'
    ),
    'running', 'no forged event ended the run'
);
SELECT lives_ok(
    $$SELECT * FROM runrelay.append_events('other', '[{"type": "runner.started"}, {"type": "Run.x"}]')$$,
    'append_events: only the run. prefix is reserved'
);

-- Reserved namespaces: schedule: run ids.
SELECT throws_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'schedule:nightly:2030-01-01T02:00:00Z')$$, '22023', NULL,
    'enqueue_run: a schedule slot''s run id is reserved'
);
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs('[{"run_id": "a"}, {"run_id": "schedule:x"}]')$$, '22023', NULL,
    'enqueue_runs: a schedule: run id is reserved'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs AS r
        WHERE r.run_id IN ('a', 'schedule:x', 'schedule:nightly:2030-01-01T02:00:00Z')
    ),
    0::bigint, 'a refused schedule: run id wrote nothing'
);
SELECT lives_ok(
    $$SELECT runrelay.enqueue_run(run_id => 'Schedule:x')$$, 'enqueue_run: the namespace is case-sensitive'
);

-- enqueue_runs is capped as a whole.
UPDATE runrelay.settings SET max_payload_bytes = 4096;
SELECT throws_ok(
    $$SELECT * FROM runrelay.enqueue_runs((
        SELECT jsonb_agg(jsonb_build_object('run_id', 'cap-' || i, 'payload', jsonb_build_object('p', repeat('x', 1000))))
        FROM generate_series(1, 5) AS i
    ))$$,
    '54000', NULL, 'enqueue_runs: items over the cap together, each under it'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.runs AS r
        WHERE r.run_id LIKE 'cap-%'
    ),
    0::bigint, 'the capped call wrote nothing'
);

-- Errors quote a short escaped prefix.
SELECT throws_ok(
    $$SELECT * FROM runrelay.claim_ledger(relay => 'x', lane => E'\x1b[31m' || repeat('l', 100000))$$,
    '22023', 'runrelay: invalid lane: unknown lane "\x1b[31m' || repeat('l', 35) || '..." (100005 characters)',
    'claim_ledger: a long lane is quoted as a 40-character escaped prefix with its length'
);

SELECT * FROM finish();
ROLLBACK;
