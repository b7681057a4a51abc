-- claim_attempts (SPEC §3.2): what a claim returns and opens, the order of
-- runnable runs, queue filters, due run_at, call_id replays, lease clamping,
-- waits woken by claims, and cancel markers applied instead of starting.
BEGIN;
SELECT plan(35);

-- One claim, its row and its effects.
SELECT runrelay.enqueue_run(run_id => 'c1', queue => 'q-c1', payload => '{"job": "x"}');
SELECT results_eq(
    $$SELECT run_id, attempt, queue, payload, resume, lease_expires_at - now() > interval '29 seconds'
      FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-c1'])$$,
    $$VALUES ('c1', 1, 'q-c1', '{"job": "x"}'::jsonb, NULL::jsonb, TRUE)$$,
    'a claim returns the run, attempt 1, its queue, payload, no resume and a lease'
);
SELECT results_eq(
    $$SELECT r.status, r.attempt_count, a.status, a.worker, a.lease_token IS NOT NULL,
             a.lease_expires_at - a.claimed_at, a.finished_at
      FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id)
      WHERE r.run_id = 'c1'$$,
    $$VALUES ('running', 1, 'running', 'w1', TRUE, interval '30 seconds', NULL::timestamptz)$$,
    'the run is running and its attempt 1 is running for worker w1 with the default 30 s lease'
);
SELECT is(tests.lifecycle('c1'), ARRAY['run.queued', 'run.started'], 'a claim emits run.started after run.queued');
SELECT is(
    (
        SELECT transport_only FROM runrelay.ledger
        WHERE run_id = 'c1' AND type = 'run.started'
    ), FALSE,
    'run.started is delivered to the consumer (not transport-only)'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w2', queues => ARRAY['q-c1'])$$,
    'a running run is not claimed again'
);
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-empty'])$$,
    'an empty queue yields no rows'
);

-- Order: highest priority first, then oldest run_at.
SELECT runrelay.enqueue_run(run_id => 'o-low-old', queue => 'q-ord', run_at => now() - interval '3 hours');
SELECT runrelay.enqueue_run(run_id => 'o-high-new', queue => 'q-ord', priority => 5, run_at => now() - interval '1 hour');
SELECT runrelay.enqueue_run(run_id => 'o-high-old', queue => 'q-ord', priority => 5, run_at => now() - interval '2 hours');
SELECT runrelay.enqueue_run(run_id => 'o-neg', queue => 'q-ord', priority => -1, run_at => now() - interval '9 hours');
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-ord'])$$,
    $$VALUES ('o-high-old')$$,
    'the best runnable run comes first: highest priority, then oldest run_at'
);
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-ord'], max_runs => 2)$$,
    $$VALUES ('o-high-new'), ('o-low-old')$$,
    'max_runs claims the next best runs, in that order'
);
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-ord'], max_runs => 5)$$,
    $$VALUES ('o-neg')$$,
    'max_runs is an upper bound: only what is runnable is claimed'
);

-- Queue filters.
SELECT runrelay.enqueue_run(run_id => 'qa-1', queue => 'q-a');
SELECT runrelay.enqueue_run(run_id => 'qb-1', queue => 'q-b');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-none'])$$,
    'a claim takes nothing from other queues'
);
SELECT set_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-a', 'q-b', 'q-a'], max_runs => 5)$$,
    ARRAY['qa-1', 'qb-1'],
    'a claim on several queues takes from each of them (repeated names are harmless)'
);

-- run_at in the future.
SELECT runrelay.enqueue_run(run_id => 'later', queue => 'q-later', run_at => now() + interval '1 hour');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-later'])$$,
    'a run whose run_at is in the future is not claimable'
);
SELECT tests.set_clock('61 minutes');
SELECT results_eq(
    $$SELECT run_id FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-later'])$$,
    $$VALUES ('later')$$,
    'once run_at has passed (database clock), the run is claimable'
);
SELECT tests.set_clock('0');

-- call_id replays.
SELECT runrelay.enqueue_run(run_id => 'cid-1', queue => 'q-cid');
SELECT runrelay.enqueue_run(run_id => 'cid-2', queue => 'q-cid');
CREATE TEMP TABLE first_claim AS
SELECT * FROM runrelay.claim_attempts(
    worker => 'w1', queues => ARRAY['q-cid'], max_runs => 5, call_id => 'c0ffee00-0000-4000-8000-000000000001'
);
SELECT is((SELECT count(*) FROM first_claim), 2::bigint, 'fixture: the first call with a call_id claims two runs');
SELECT runrelay.enqueue_run(run_id => 'cid-3', queue => 'q-cid');
SELECT set_eq(
    $$SELECT * FROM runrelay.claim_attempts(
        worker => 'w1', queues => ARRAY['q-cid'], max_runs => 5, call_id => 'c0ffee00-0000-4000-8000-000000000001'
    )$$,
    $$SELECT * FROM first_claim$$,
    'repeating a claim with the same call_id returns exactly what the first call took (same attempts and tokens)'
);
-- Reorder the runs as the replay's old re-sort by priority would have seen
-- them: the replay still answers in the order the claim took them.
UPDATE runrelay.runs SET priority = CASE run_id WHEN 'cid-1' THEN -1 ELSE 1 END
WHERE run_id IN ('cid-1', 'cid-2');
SELECT results_eq(
    $$SELECT run_id, attempt, lease_token FROM runrelay.claim_attempts(
        worker => 'w1', queues => ARRAY['q-cid'], max_runs => 5, call_id => 'c0ffee00-0000-4000-8000-000000000001'
    )$$,
    $$VALUES ('cid-1', 1, tests.token('cid-1')), ('cid-2', 1, tests.token('cid-2'))$$,
    'the replay answers in the original claim order, whatever the runs look like now'
);
SELECT results_eq(
    $$SELECT count(*), max(attempt) FROM runrelay.attempts WHERE run_id IN ('cid-1', 'cid-2', 'cid-3')$$,
    $$VALUES (2::bigint, 1)$$,
    'the replay opens no attempt (the newly runnable cid-3 is not taken)'
);
SELECT is(
    tests.event_count('cid-1') + tests.event_count('cid-2') + tests.event_count('cid-3'), 5::bigint,
    'the replay emits no second run.started'
);
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(
        worker => 'w1', queues => ARRAY['q-cid'], call_id => 'c0ffee00-0000-4000-8000-000000000002'
    )$$,
    $$VALUES ('cid-3', 1)$$,
    'a new call_id claims afresh'
);

-- Lease clamping (5..300 seconds), never rejected.
SELECT runrelay.enqueue_run(run_id => 'l-short', queue => 'q-l-short');
SELECT runrelay.enqueue_run(run_id => 'l-long', queue => 'q-l-long');
SELECT runrelay.enqueue_run(run_id => 'l-neg', queue => 'q-l-neg');
SELECT runrelay.enqueue_run(run_id => 'l-null', queue => 'q-l-null');
SELECT runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-l-short'], lease_seconds => 1);
SELECT runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-l-long'], lease_seconds => 100000);
SELECT runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-l-neg'], lease_seconds => -30);
SELECT runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-l-null'], lease_seconds => NULL);
SELECT is(
    (
        SELECT lease_expires_at - claimed_at FROM runrelay.attempts
        WHERE run_id = 'l-short'
    ), interval '5 seconds',
    'lease_seconds below 5 is clamped to 5'
);
SELECT is(
    (
        SELECT lease_expires_at - claimed_at FROM runrelay.attempts
        WHERE run_id = 'l-long'
    ), interval '300 seconds',
    'lease_seconds above 300 is clamped to 300'
);
SELECT is(
    (
        SELECT lease_expires_at - claimed_at FROM runrelay.attempts
        WHERE run_id = 'l-neg'
    ), interval '5 seconds',
    'a negative lease_seconds is clamped to 5, not rejected'
);
SELECT is(
    (
        SELECT lease_expires_at - claimed_at FROM runrelay.attempts
        WHERE run_id = 'l-null'
    ), interval '30 seconds',
    'a null lease_seconds means the default 30'
);

-- Waits whose time has come are woken by the next claim on their queue.
SELECT tests.start_waiting('sleeper', jsonb_build_object('kind', 'sleep', 'until', now() + interval '10 minutes'));
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['sleeper'])$$,
    'a sleep that is not due is not woken'
);
SELECT tests.set_clock('11 minutes');
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['sleeper'])$$,
    $$VALUES ('sleeper', 2)$$,
    'a due sleep is woken by the next claim on its queue, which also claims it'
);
SELECT is(
    tests.lifecycle('sleeper'),
    ARRAY['run.queued', 'run.started', 'run.waiting', 'run.resumed', 'run.started'],
    'the woken sleep emits run.resumed before the new run.started'
);
SELECT tests.set_clock('0');
SELECT tests.start_waiting(
    'ev-timeout', jsonb_build_object('kind', 'event', 'name', 'go', 'timeout_at', now() + interval '10 minutes')
);
SELECT tests.set_clock('11 minutes');
SELECT results_eq(
    $$SELECT run_id, attempt, resume FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['ev-timeout'])$$,
    $$VALUES ('ev-timeout', 2, '{"timed_out": true}'::jsonb)$$,
    'an event wait past timeout_at is woken by the next claim with resume {"timed_out": true}'
);
SELECT is(tests.state('ev-timeout'), 'running:resumed,running', 'the timed-out attempt is resumed, a new one runs');
SELECT tests.set_clock('0');

-- A queued run with a cancel marker is cancelled instead of started.
SELECT runrelay.enqueue_run(run_id => 'marked', queue => 'q-marked');
SELECT tests.mark_cancel('marked', 'stop');
SELECT is_empty(
    $$SELECT * FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-marked'])$$,
    'a run with a cancel marker is not started'
);
SELECT is(tests.state('marked'), 'cancelled:', 'the claim applied the marker: the run is cancelled, no attempt opened');
SELECT is(tests.lifecycle('marked'), ARRAY['run.queued', 'run.cancelled'], 'the claim emitted run.cancelled');

-- In one batch: marked candidates are cancelled (or, when their key is busy,
-- left queued with the marker for a later claim); the rest start together.
SELECT runrelay.enqueue_run(run_id => 'mix-1', queue => 'q-mix', run_at => now() - interval '4 seconds');
SELECT runrelay.enqueue_run(run_id => 'mix-2', queue => 'q-mix', run_at => now() - interval '3 seconds');
SELECT runrelay.enqueue_run(run_id => 'mix-3', queue => 'q-mix', run_at => now() - interval '2 seconds');
SELECT runrelay.enqueue_run(run_id => 'mix-4', queue => 'q-mix', run_at => now() - interval '1 second');
SELECT tests.set_key('mix-4', 'mix-key');
SELECT tests.mark_cancel('mix-2');
SELECT tests.mark_cancel('mix-4');
SELECT tests.hold_key('mix-key');
SELECT results_eq(
    $$SELECT run_id, attempt FROM runrelay.claim_attempts(worker => 'w1', queues => ARRAY['q-mix'], max_runs => 4)$$,
    $$VALUES ('mix-1', 1), ('mix-3', 1)$$,
    'a batch claim starts the unmarked candidates, in claim order'
);
SELECT tests.release_key();
SELECT results_eq(
    $$SELECT run_id, tests.state(run_id) FROM runrelay.runs WHERE run_id LIKE 'mix-%' ORDER BY run_id$$,
    $$VALUES ('mix-1', 'running:running'), ('mix-2', 'cancelled:'), ('mix-3', 'running:running'), ('mix-4', 'queued:')$$,
    'the marked run is cancelled; the marked run whose key lock was busy stays queued'
);
SELECT results_eq(
    $$SELECT run_id FROM runrelay.cancellations WHERE run_id LIKE 'mix-%'$$,
    $$VALUES ('mix-4')$$,
    'its marker waits for the next custody holder'
);
SELECT results_eq(
    $$SELECT l.run_id, l.seq, l.payload, ll.head_seq, ll.available_at IS NOT NULL
      FROM runrelay.ledger AS l
      INNER JOIN runrelay.ledger_lanes AS ll ON l.run_id = ll.run_id AND l.lane = ll.lane
      WHERE l.type = 'run.started' AND l.run_id LIKE 'mix-%' ORDER BY l.run_id$$,
    $$VALUES ('mix-1', 2::bigint, '{"attempt": 1, "worker": "w1"}'::jsonb, 1::bigint, TRUE),
             ('mix-3', 2::bigint, '{"attempt": 1, "worker": "w1"}'::jsonb, 1::bigint, TRUE)$$,
    'each started run has its run.started after run.queued, and its lane keeps the head'
);

SELECT * FROM finish();
ROLLBACK;
