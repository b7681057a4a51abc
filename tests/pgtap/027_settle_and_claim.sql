-- settle_and_claim against the separate calls it fuses (SPEC §3.2).
--
-- Each case builds the same state three times, under the prefixes fused<n>_,
-- split<n>_ and ref<n>_ (runs, queues and concurrency keys all carry the
-- prefix). The fused side makes one settle_and_claim call; the split side
-- makes the calls a worker makes without it: the item's own function for
-- each item, in item order, then claim_attempts; the reference side makes
-- the fused call with runrelay.reference_paths on, so that no fused fast path
-- is taken (settle_and_claim's one-statement check of a plain call,
-- _complete's one-statement batch) and every item goes through the general
-- steps. All three must give the same answer (outcomes, claimed runs and
-- their attempts, payloads and resumes) and leave the same rows: runs,
-- attempts and ledger events (type, order, payload), with the prefix, lease
-- tokens and the moments of this transaction normalised away (the fixtures
-- are in helpers_settle.sql).
BEGIN;
SELECT plan(157);

-- plain: one completion; the claim takes the next run of the queue.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('plain') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a', payload => '{"n": 1}') FROM tests.sc_both('plain') AS p;
SELECT tests.sc_case(
    'plain', '[{"run": "a", "result": {"ok": true}}]', ARRAY['a'],
    '[["settled", "a", 1, "completed"], ["claimed", "next", 1, null]]'
);

-- final: a completion with final events (complete_attempt's path).
SELECT tests.start_run(p || 'a') FROM tests.sc_both('final') AS p;
SELECT tests.sc_case(
    'final', '[{"run": "a", "result": {"r": 1}, "final_events": [{"type": "done", "payload": {"x": 1}}]}]', ARRAY['a'],
    '[["settled", "a", 1, "completed"]]'
);

-- keyed: completing a keyed run promotes the next run of its key, which the
-- claim then takes.
SELECT tests.start_run(p || 'a', 3, p || 'key') FROM tests.sc_both('keyed') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'b', queue => p || 'a', concurrency_key => p || 'key')
FROM tests.sc_both('keyed') AS p;
SELECT tests.sc_case(
    'keyed', '[{"run": "a"}]', ARRAY['a'],
    '[["settled", "a", 1, "completed"], ["claimed", "b", 1, null]]'
);

-- stale: a wrong token is fence_lost and changes nothing; the claim still runs.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('stale') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('stale') AS p;
SELECT tests.sc_case(
    'stale', '[{"run": "a", "lease_token": "5b3cf6a4-5cc8-4f4c-9d5e-0e0f7b4a9c11", "op": "fail", "error": {}}]', ARRAY['a'],
    '[["settled", "a", 1, "fence_lost"], ["claimed", "next", 1, null]]'
);

-- marker: a cancel marker no writer has applied yet wins over the completion.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('marker') AS p;
SELECT tests.mark_cancel(p || 'a') FROM tests.sc_both('marker') AS p;
SELECT tests.sc_case('marker', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "cancelled"]]');

-- cancelled: the run was cancelled before the settlement arrived.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('cancelled') AS p;
SELECT runrelay.cancel_run(p || 'a', 'stop') FROM tests.sc_both('cancelled') AS p;
SELECT tests.sc_case('cancelled', '[{"run": "a", "op": "release"}]', ARRAY['a'], '[["settled", "a", 1, "cancelled"]]');

-- retry: a failure with attempts left; retry_at is past, so the claim takes
-- the run again (attempt 2).
SELECT tests.start_run(p || 'a') FROM tests.sc_both('retry') AS p;
SELECT tests.sc_case(
    'retry',
    '[{"run": "a", "op": "fail", "error": {"e": 1}, "retry_at": "2000-01-01T00:00:00Z", "final_events": [{"type": "oops"}]}]',
    ARRAY['a'],
    '[["settled", "a", 1, "retry_scheduled"], ["claimed", "a", 2, null]]'
);

-- exhausted: the last attempt fails; the run fails.
SELECT tests.start_run(p || 'a', 1) FROM tests.sc_both('exhausted') AS p;
SELECT tests.sc_case(
    'exhausted', '[{"run": "a", "op": "fail", "error": {"e": 2}}]', ARRAY['a'], '[["settled", "a", 1, "failed"]]'
);

-- waiting: a suspension on an event that was not signalled.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('waiting') AS p;
SELECT tests.sc_case(
    'waiting', '[{"run": "a", "op": "suspend", "wait": {"kind": "event", "name": "go", "timeout_at": "2100-01-01T00:00:00Z"}}]',
    ARRAY['a'], '[["settled", "a", 1, "waiting"]]'
);

-- resumed: the signal was stored first, so the suspension resumes at once
-- and the claim takes the run with its resume.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('resumed') AS p;
SELECT runrelay.signal_run(p || 'a', 'go', '{"v": 1}') FROM tests.sc_both('resumed') AS p;
SELECT tests.sc_case(
    'resumed', '[{"run": "a", "op": "suspend", "wait": {"kind": "event", "name": "go"}, "final_events": [{"type": "paused"}]}]',
    ARRAY['a'], '[["settled", "a", 1, "resumed"], ["claimed", "a", 2, null]]'
);

-- released: handed back for later, with a reason; nothing to claim.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('released') AS p;
SELECT tests.sc_case(
    'released', '[{"run": "a", "op": "release", "run_at": "2100-01-01T00:00:00Z", "reason": "snooze"}]',
    ARRAY['a'], '[["settled", "a", 1, "released"]]'
);

-- released_now: handed back for now; the claim takes it again.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('released_now') AS p;
SELECT tests.sc_case(
    'released_now', '[{"run": "a", "op": "release", "run_at": null}]',
    ARRAY['a'], '[["settled", "a", 1, "released"], ["claimed", "a", 2, null]]'
);

-- mixed: every op in one call, items out of run_id order, a stale one among
-- them and two plain completions; answers in item order, claims in claim order.
SELECT tests.start_run(p || r) FROM tests.sc_both('mixed') AS p CROSS JOIN unnest(ARRAY['e', 'd', 'c', 'b', 'a', 'f']) AS r;
SELECT tests.mark_cancel(p || 'f') FROM tests.sc_both('mixed') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a', priority => 5) FROM tests.sc_both('mixed') AS p;
SELECT tests.sc_case(
    'mixed',
    '[{"run": "e", "op": "release"},
      {"run": "b", "result": {"b": 1}},
      {"run": "d", "op": "suspend", "wait": {"kind": "sleep", "until": "2100-01-01T00:00:00Z"}},
      {"run": "c", "op": "fail", "error": {"c": 1}, "retry_at": "2000-01-01T00:00:00Z"},
      {"run": "a", "op": "complete", "lease_token": "5b3cf6a4-5cc8-4f4c-9d5e-0e0f7b4a9c11"},
      {"run": "f"}]',
    ARRAY['a', 'c', 'e'],
    '[["settled", "e", 1, "released"], ["settled", "b", 1, "completed"], ["settled", "d", 1, "waiting"],
      ["settled", "c", 1, "retry_scheduled"], ["settled", "a", 1, "fence_lost"], ["settled", "f", 1, "cancelled"],
      ["claimed", "next", 1, null], ["claimed", "c", 2, null], ["claimed", "e", 2, null]]',
    3
);

-- plain_batch: several plain completions, out of run_id order (a worker's
-- shared settlement): every item completes in the one statement of the
-- fused path; answers in item order.
SELECT tests.start_run(p || r) FROM tests.sc_both('plain_batch') AS p CROSS JOIN unnest(ARRAY['c', 'a', 'b']) AS r;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'b') FROM tests.sc_both('plain_batch') AS p;
SELECT tests.sc_case(
    'plain_batch', '[{"run": "c", "result": {"c": 3}}, {"run": "a"}, {"run": "b", "op": "complete", "result": [1]}]',
    ARRAY['b'],
    '[["settled", "c", 1, "completed"], ["settled", "a", 1, "completed"], ["settled", "b", 1, "completed"],
      ["claimed", "next", 1, null]]'
);

-- plain_stale: a batch of plain completions with a stale one among them: the
-- fused statement writes all or none, so the batch goes item by item.
SELECT tests.start_run(p || r) FROM tests.sc_both('plain_stale') AS p CROSS JOIN unnest(ARRAY['a', 'b', 'c']) AS r;
SELECT tests.sc_case(
    'plain_stale', '[{"run": "a"}, {"run": "b", "lease_token": "5b3cf6a4-5cc8-4f4c-9d5e-0e0f7b4a9c11"}, {"run": "c"}]',
    ARRAY['a'],
    '[["settled", "a", 1, "completed"], ["settled", "b", 1, "fence_lost"], ["settled", "c", 1, "completed"]]'
);

-- plain_keyed: plain completions, one of a keyed run: the call takes the
-- custody path (key locks first); the next run of the key is promoted.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('plain_keyed') AS p;
SELECT tests.start_run(p || 'k', 3, p || 'key') FROM tests.sc_both('plain_keyed') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'k2', queue => p || 'k', concurrency_key => p || 'key')
FROM tests.sc_both('plain_keyed') AS p;
SELECT tests.sc_case(
    'plain_keyed', '[{"run": "k"}, {"run": "a"}]', ARRAY['k'],
    '[["settled", "k", 1, "completed"], ["settled", "a", 1, "completed"], ["claimed", "k2", 1, null]]'
);

-- again: a completion already written (a worker's retried call): the answer
-- recorded the first time, nothing written.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('again') AS p;
SELECT runrelay.complete_attempt(p || 'a', 1, tests.token(p || 'a'), '{"first": true}') FROM tests.sc_both('again') AS p;
SELECT tests.sc_case('again', '[{"run": "a", "result": {"second": true}}]', ARRAY['a'], '[["settled", "a", 1, "completed"]]');

-- waited: the attempt suspended (a sleep); a completion with its token is
-- fence_lost, and the claim wakes nothing yet.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('waited') AS p;
SELECT runrelay.suspend_attempt(p || 'a', 1, tests.token(p || 'a'), '{"kind": "sleep", "until": "2100-01-01T00:00:00Z"}')
FROM tests.sc_both('waited') AS p;
SELECT tests.sc_case('waited', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "fence_lost"]]');

-- The call a worker makes after each job (one plain completion, a claim of
-- at most one run) has a path of its own (_settle_one). These cases take it
-- through each of its branches; the reference side takes the general steps.

-- one_empty: nothing left to claim.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_empty') AS p;
SELECT tests.sc_case('one_empty', '[{"run": "a", "result": {"n": 1}}]', ARRAY['a'], '[["settled", "a", 1, "completed"]]');

-- one_only: max_runs 0 settles and leaves the next run queued.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_only') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_only') AS p;
SELECT tests.sc_case('one_only', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"]]', 0);

-- one_no_result: op given, no result: the result is {}.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_no_result') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a', payload => '{"x": 2}')
FROM tests.sc_both('one_no_result') AS p;
SELECT tests.sc_case(
    'one_no_result', '[{"run": "a", "op": "complete"}]', ARRAY['a'],
    '[["settled", "a", 1, "completed"], ["claimed", "next", 1, null]]'
);

-- one_wrong_attempt: an attempt the run never had is fence_lost; the claim
-- still runs.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_wrong_attempt') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_wrong_attempt') AS p;
SELECT tests.sc_case(
    'one_wrong_attempt', '[{"run": "a", "attempt": 2}]', ARRAY['a'],
    '[["settled", "a", 2, "fence_lost"], ["claimed", "next", 1, null]]'
);

-- one_unknown: a run that does not exist is fence_lost.
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_unknown') AS p;
SELECT tests.sc_case(
    'one_unknown', '[{"run": "ghost", "attempt": 1, "lease_token": "5b3cf6a4-5cc8-4f4c-9d5e-0e0f7b4a9c11"}]', ARRAY['a'],
    '[["settled", "ghost", 1, "fence_lost"], ["claimed", "next", 1, null]]'
);

-- one_marked_next: the run the claim finds has a cancel marker: it is
-- cancelled instead of started, and nothing is claimed.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_marked_next') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_marked_next') AS p;
SELECT tests.mark_cancel(p || 'next') FROM tests.sc_both('one_marked_next') AS p;
SELECT tests.sc_case('one_marked_next', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"]]');

-- one_caught_up: a relay has delivered every event of both runs, so each
-- event written starts its lane again (_lanes_on_write).
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_caught_up') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_caught_up') AS p;
SELECT tests.sc_deliver(p || r) FROM tests.sc_both('one_caught_up') AS p CROSS JOIN unnest(ARRAY['a', 'next']) AS r;
SELECT tests.sc_case(
    'one_caught_up', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"], ["claimed", "next", 1, null]]'
);

-- one_steps: the claimed run recorded a step in an attempt it handed back;
-- the claim returns it.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_steps') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_steps') AS p;
SELECT tests.claim_run(p || 'next') FROM tests.sc_both('one_steps') AS p;
SELECT runrelay.record_step(p || 'next', 1, tests.token(p || 'next'), 'charge', '{"id": 7}') FROM tests.sc_both('one_steps') AS p;
SELECT runrelay.release_attempt(p || 'next', 1, tests.token(p || 'next')) FROM tests.sc_both('one_steps') AS p;
SELECT tests.sc_case(
    'one_steps', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"], ["claimed", "next", 2, null]]'
);

-- one_tasks: a claim for one task passes over a better run of another.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_tasks') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a', task => 'sc_send') FROM tests.sc_both('one_tasks') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'other', queue => p || 'a', task => 'sc_other', priority => 9)
FROM tests.sc_both('one_tasks') AS p;
SELECT tests.sc_case(
    'one_tasks', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"], ["claimed", "next", 1, null]]', 1,
    ARRAY['sc_send']
);

-- one_due: a sleep on the queue is due, so the claim is _claim's: it wakes
-- the sleeper and takes it.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_due') AS p;
SELECT runrelay.enqueue_run(run_id => p || 's', queue => p || 'a') FROM tests.sc_both('one_due') AS p;
SELECT tests.claim_run(p || 's') FROM tests.sc_both('one_due') AS p;
SELECT runrelay.suspend_attempt(p || 's', 1, tests.token(p || 's'), jsonb_build_object('kind', 'sleep', 'until', now() + interval '1 hour'))
FROM tests.sc_both('one_due') AS p;
UPDATE runrelay.runs SET wake_at = now() - interval '1 minute'
WHERE run_id IN (SELECT p || 's' FROM tests.sc_both('one_due') AS p);
SELECT tests.sc_case(
    'one_due', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"], ["claimed", "s", 2, null]]'
);

-- one_paused: while any queue is paused the claim is _claim's; this queue
-- is not paused, so it claims as ever.
SELECT tests.start_run(p || 'a') FROM tests.sc_both('one_paused') AS p;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('one_paused') AS p;
SELECT runrelay.pause_queue(p || 'other') FROM tests.sc_both('one_paused') AS p;
SELECT tests.sc_case(
    'one_paused', '[{"run": "a"}]', ARRAY['a'], '[["settled", "a", 1, "completed"], ["claimed", "next", 1, null]]'
);
SELECT runrelay.resume_queue(p || 'other') FROM tests.sc_both('one_paused') AS p;

-- replay: the same call again (a lost reply) answers the same, settlements
-- through their fences and the claim through call_id, and writes nothing.
SELECT tests.start_run(p || r) FROM tests.sc_both('replay') AS p CROSS JOIN unnest(ARRAY['a', 'b']) AS r;
SELECT runrelay.enqueue_run(run_id => p || 'next', queue => p || 'a') FROM tests.sc_both('replay') AS p;
CREATE TEMP TABLE replay AS
SELECT
    tests.sc_items('fused_replay_', '[{"run": "a"}, {"run": "b", "op": "fail", "error": {}}]') AS fused_items,
    tests.sc_items('split_replay_', '[{"run": "a"}, {"run": "b", "op": "fail", "error": {}}]') AS split_items,
    gen_random_uuid() AS fused_call,
    gen_random_uuid() AS split_call;
CREATE TEMP TABLE replay_first AS
SELECT c.* FROM replay AS rp, runrelay.settle_and_claim(rp.fused_items, 'w1', ARRAY['fused_replay_a'], 1, 30, rp.fused_call) AS c;
CREATE TEMP TABLE replay_state AS SELECT tests.sc_snapshot('fused_replay_') AS snapshot;
SELECT results_eq(
    $$SELECT c.* FROM replay, runrelay.settle_and_claim(fused_items, 'w1', ARRAY['fused_replay_a'], 1, 30, fused_call) AS c$$,
    $$SELECT * FROM replay_first$$,
    'replay: the repeated call answers exactly what the first answered (lease tokens included)'
);
SELECT is(tests.sc_snapshot('fused_replay_'), (SELECT snapshot FROM replay_state), 'replay: the repeat wrote nothing');
SELECT is(
    (SELECT jsonb_agg(jsonb_build_array(kind, replace(run_id, 'fused_', ''), attempt, outcome)) FROM replay_first),
    '[["settled", "replay_a", 1, "completed"], ["settled", "replay_b", 1, "retry_scheduled"], ["claimed", "replay_next", 1, null]]',
    'replay: the first call settled both and claimed the next run'
);
SELECT runrelay.complete_attempt(i.value ->> 'run_id', 1, (i.value ->> 'lease_token')::uuid)
FROM replay AS rp, jsonb_array_elements(rp.split_items) AS i (value)
WHERE i.value ->> 'run_id' = 'split_replay_a';
SELECT runrelay.fail_attempt(i.value ->> 'run_id', 1, (i.value ->> 'lease_token')::uuid, '{}')
FROM replay AS rp, jsonb_array_elements(rp.split_items) AS i (value)
WHERE i.value ->> 'run_id' = 'split_replay_b';
SELECT runrelay.claim_attempts('w1', ARRAY['split_replay_a'], 1, 30, split_call) FROM replay;
SELECT runrelay.complete_attempt(i.value ->> 'run_id', 1, (i.value ->> 'lease_token')::uuid)
FROM replay AS rp, jsonb_array_elements(rp.split_items) AS i (value)
WHERE i.value ->> 'run_id' = 'split_replay_a';
SELECT runrelay.fail_attempt(i.value ->> 'run_id', 1, (i.value ->> 'lease_token')::uuid, '{}')
FROM replay AS rp, jsonb_array_elements(rp.split_items) AS i (value)
WHERE i.value ->> 'run_id' = 'split_replay_b';
SELECT runrelay.claim_attempts('w1', ARRAY['split_replay_a'], 1, 30, split_call) FROM replay;
-- The retry's run_at is random backoff: equal on both sides only as 'a
-- future moment', so it is compared apart from the rest.
SELECT is(
    tests.sc_snapshot('fused_replay_') #- '{runs,1,run_at}' #- '{ledger,5,payload,run_at}',
    tests.sc_snapshot('split_replay_') #- '{runs,1,run_at}' #- '{ledger,5,payload,run_at}',
    'replay: the same rows as the separate calls repeated'
);
SELECT ok(
    (
        SELECT r.run_at > now() FROM runrelay.runs AS r
        WHERE r.run_id = 'fused_replay_b'
    ),
    'replay: the retried run waits for its backoff'
);

-- A claim replayed by call_id alone (no items) returns exactly the first claim.
SELECT runrelay.enqueue_run(run_id => 'only_claim_' || i, queue => 'only_claim') FROM generate_series(1, 3) AS i;
CREATE TEMP TABLE claim_call AS SELECT gen_random_uuid() AS id;
CREATE TEMP TABLE claim_first AS
SELECT c.* FROM claim_call, runrelay.settle_and_claim('[]', 'w1', ARRAY['only_claim'], 2, 30, claim_call.id) AS c;
SELECT is((
    SELECT count(*) FROM claim_first
    WHERE kind = 'claimed'
), 2::bigint, 'empty items: only claims, up to max_runs');
SELECT is((
    SELECT count(*) FROM claim_first
    WHERE kind <> 'claimed'
), 0::bigint, 'empty items: no settled row');
SELECT results_eq(
    $$SELECT c.* FROM claim_call, runrelay.settle_and_claim('[]', 'w1', ARRAY['only_claim'], 2, 30, claim_call.id) AS c$$,
    $$SELECT * FROM claim_first$$,
    'a claim replayed by call_id returns exactly the first claim, in its order'
);
SELECT is(
    (
        SELECT count(*) FROM runrelay.attempts AS a
        WHERE a.run_id LIKE 'only_claim_%'
    ), 2::bigint,
    'the replayed claim opened nothing'
);
SELECT results_eq(
    $$SELECT c.run_id, c.attempt, c.lease_token, c.queue, c.payload, c.resume, c.lease_expires_at, c.task, c.steps
      FROM claim_first AS c$$,
    $$SELECT c.* FROM claim_call, runrelay.claim_attempts('w1', ARRAY['only_claim'], 2, 30, claim_call.id) AS c$$,
    'the claimed rows are claim_attempts'' rows for the same call_id'
);

-- max_runs 0 settles and claims nothing, even with runs waiting on the queue.
SELECT tests.start_run('settle_only');
SELECT runrelay.enqueue_run(run_id => 'settle_only_next', queue => 'settle_only');
SELECT results_eq(
    $$SELECT kind, run_id, attempt, outcome FROM runrelay.settle_and_claim(
        jsonb_build_array(jsonb_build_object('run_id', 'settle_only', 'attempt', 1, 'lease_token', tests.token('settle_only'))),
        'w1', ARRAY['settle_only'], 0)$$,
    $$VALUES ('settled', 'settle_only', 1, 'completed')$$,
    'max_runs 0: settles only'
);
SELECT is(tests.state('settle_only_next'), 'queued:', 'max_runs 0: the next run was not claimed');

SELECT * FROM finish();
ROLLBACK;
