-- The lock-wait bound: every writing function waits at most 10 s for a lock,
-- or the caller's lock_timeout when that is tighter, and leaves the caller's
-- lock_timeout as it found it, whatever it answers. (Waiting itself needs a
-- second session: tests/python/test_lock_wait.py.)
BEGIN;
SELECT plan(12);

SET LOCAL lock_timeout = '0';
SELECT is(runrelay._bound_lock_wait(), '0', '_bound_lock_wait returns the caller''s value');
SELECT is(current_setting('lock_timeout'), '10s', 'no caller bound (0): 10 s from then on');
SELECT runrelay._restore_lock_wait('0');
SELECT is(current_setting('lock_timeout'), '0', '_restore_lock_wait puts the caller''s value back');

SET LOCAL lock_timeout = '1min';
SELECT is(runrelay._bound_lock_wait(), '1min', 'a looser caller''s value is returned');
SELECT is(current_setting('lock_timeout'), '10s', 'a looser caller (1 min) is bounded at 10 s');
SELECT is(runrelay._restore_lock_wait('1min', 'done'::text), 'done', 'the result passes through');
SELECT is(current_setting('lock_timeout'), '1min', 'and the caller''s value is back');

SET LOCAL lock_timeout = '200ms';
SELECT is(runrelay._bound_lock_wait(), '200ms', 'a tighter caller''s value is returned');
SELECT is(current_setting('lock_timeout'), '200ms', 'a tighter caller (200 ms) keeps its own bound');

-- Through the public functions, on outcomes that leave early.
SET LOCAL lock_timeout = '0';
SELECT is(runrelay.cancel_run('nowhere'), 'not_found', 'cancel_run of a missing run');
SELECT is(runrelay.heartbeat('nowhere', 1, gen_random_uuid())::text, '(fence_lost,)', 'a fenced-out heartbeat');
SELECT is(current_setting('lock_timeout'), '0', 'the caller''s lock_timeout is unchanged after both');

SELECT * FROM finish();
ROLLBACK;
