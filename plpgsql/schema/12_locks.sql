-- Lock rows: what runrelay serialises on where no row of its own exists yet
-- (docs/security.md#locks-no-other-login-can-take). Only the functions lock them: PUBLIC has no
-- privilege on these tables and no runrelay role is granted any, so a login
-- cannot take, hold or even see one of these locks (an advisory lock, by
-- contrast, is open to every login that can compute or read its id).

-- One row per concurrency key that a run ever had: custody step 1 is this
-- row, locked FOR UPDATE (waiting, by _lock_key) or FOR UPDATE SKIP LOCKED
-- (by _try_lock_key). Created on demand by the first locker (enqueue, or a
-- path that meets a key with no row), in the transaction that takes it:
-- until that commits, a concurrent locker's insert of the same key waits for
-- it, which serialises the key as the row lock does.
--
-- Never deleted by runrelay: a run with a key always has its key's row (it
-- was created when the first run of the key was enqueued, or by the upgrade
-- that introduced this table), so a try-lock finds the row and never waits.
-- A row costs its key's bytes plus about 30; a deployment with an unbounded
-- key space that wants them gone deletes the rows of keys with no run left,
-- while nothing enqueues those keys (docs/scheduler.md, "Concurrency keys").
CREATE TABLE concurrency_keys (
    key text PRIMARY KEY
);

REVOKE ALL ON TABLE concurrency_keys FROM public;

-- The call lock of signal_run, cancel_run and retry_run with a call_id
-- (_lock_call_id, calls.sql): the call inserts its id here and deletes it
-- again in the same transaction. The row is never visible to anyone else,
-- but its primary-key entry makes a concurrent insert of the same id wait
-- until the inserting transaction ends; then that insert finds a dead entry
-- and proceeds. Empty at rest.
CREATE TABLE call_locks (
    call_id uuid PRIMARY KEY
);

REVOKE ALL ON TABLE call_locks FROM public;
