-- Custody locks. The one lock order every writer follows:
--
--   0. a call id's lock (signal_run, cancel_run, retry_run with a call_id;
--      _lock_call_id, calls.sql): at most one per call, before anything else;
--   1. the rows of the runs' concurrency keys (table concurrency_keys,
--      _lock_key), ascending by key COLLATE "C" (only for runs that have a
--      key);
--   2. run rows, ascending by run_id COLLATE "C";
--   3. attempt rows, ascending by attempt;
--   4. ledger_lanes rows, ascending by (run_id COLLATE "C", lane) — see below.
--
-- Every one of these is a row lock on a table no login but runrelay's
-- functions can lock (schema/12_locks.sql, docs/security.md#locks-no-other-login-can-take): an
-- advisory lock id can be computed and taken by any login, which could then
-- stall every writer of a key. A key with no row yet is locked by inserting
-- its row; a concurrent locker of that key waits in its own insert until the
-- inserter ends, which is the same wait at the same step.
--
-- Blocking acquisitions always follow this order, so writers never
-- deadlock. SKIP LOCKED paths (claims, the reaper, cancel_run) may try a
-- key lock after a run row lock (_try_lock_key): a try never waits, so it
-- cannot close a cycle. (A try that finds no row inserts one and could wait
-- for a concurrent inserter; that needs a run whose key has no row, which
-- runrelay never leaves: schema/12_locks.sql.) One collation, "C", for every
-- sort that orders locks: a sort under the database's default collation can
-- put two run_ids the other way round.

-- Why keys come first: a run that ends must promote the next run of its key
-- (clear key_held), which locks that run's row; whoever else could hold that
-- row would have taken the key first and is therefore not running.
--
-- Lanes (ledger_lanes rows) have two kinds of holders:
--   * appenders (every path that writes the ledger, under the run's custody
--     locks) never wait for a lane row: a lane whose head is live is not
--     locked at all, and one that must change (nothing pending) is locked
--     SKIP LOCKED, ascending within the statement (append.sql);
--   * relays never hold a run row while they wait: they take lane rows,
--     waiting, in the order above (_lock_event_lanes for several lanes; one
--     lane otherwise, or SKIP LOCKED in discovery), then the lanes' ledger
--     rows, and last, never waiting, a share lock on a run row (SKIP LOCKED,
--     _refresh_lane) before they call a lane empty.
-- So no cycle can pass through a lane: the only waits for a lane row are a
-- relay's, in one order, behind holders that wait for nothing or for lanes
-- further up that order.
--
-- Wake-ups (ledger_wakeups rows, append.sql): an appender that finds an
-- empty lane held records a wake-up instead; a lane-lock holder consumes it
-- (_lane_scan_from). Inserting a wake-up can wait for a relay's uncommitted
-- consumption of the same row, but relays consume only after every lane lock
-- they wait for is held and then wait for nothing, so that wait ends.
--
-- The paths that lock more than one row of a kind, and their order:
--   claim_attempts   runs SKIP LOCKED (best first), key try-locks; due waits
--                    first (_end_due_waits: runs SKIP LOCKED, oldest wake_at first,
--                    woken in run_id COLLATE "C" order); lanes as an appender.
--   complete_attempts  keys (_lock_keys), runs in run_id COLLATE "C" order,
--                    then per item its attempt; lanes as an appender.
--   settle_and_claim  with several items: keys (_lock_keys), runs in run_id
--                    COLLATE "C" order, taken ahead; then each item's own
--                    function (re-takes them without waiting, then its
--                    attempt), completions together by complete_attempts;
--                    then claim_attempts, which only skips or tries.
--   enqueue_runs     keys (_lock_concurrency_keys), then inserts its new runs
--                    in run_id COLLATE "C" order (an insert that meets a
--                    concurrent insert of the same run_id waits for it);
--                    lanes as an appender.
--   reap_expired     one run at a time, each by _try_lock_run (SKIP LOCKED).
--   cancel_run       one run, SKIP LOCKED; its attempts ascending.
--   purge_runs       runs SKIP LOCKED in run_id COLLATE "C" order; then the
--                    run-delete trigger (schema/08_run_history.sql) locks the
--                    deleted runs' lanes in the lane order, waiting, before
--                    it deletes their events (as any DELETE FROM runs does).
--   fail_ledger, renew_ledger_lease, release_ledger, requeue_ledger_event,
--   requeue_blocked_heads
--                    lanes by _lock_event_lanes (the lane order), waiting.
--   ack_ledger, claim_ledger  one lane (discovery: one at a time, SKIP LOCKED).
-- A caller's transaction that spans several calls composes their locks in
-- the order it makes the calls; these guarantees are per call.

-- A concurrency key's lock (custody step 1): its concurrency_keys row
-- (schema/12_locks.sql), FOR UPDATE, waiting. A key without a row gets one:
-- the insert holds the key until this transaction ends (a concurrent locker
-- waits in its own insert, then finds the row and locks it); when another
-- transaction inserted it first, the loop locks that row. Loops only while
-- rows of the key appear and vanish under it, which runrelay never does.
-- PL/pgSQL, not SQL: a SQL function with a SET clause is never inlined and
-- is parsed and planned again on every call (~16 us); PL/pgSQL runs its
-- statements from cached plans.
CREATE FUNCTION _lock_key(p_key text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    LOOP
        PERFORM FROM concurrency_keys AS k WHERE k.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO concurrency_keys AS k (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;
END;
$$;

COMMENT ON FUNCTION _lock_key(text) IS
'Locks a concurrency key''s row (custody step 1), waiting; creates the row when the key has none.';

-- The same without waiting: TRUE when this transaction now holds the key.
-- SKIP LOCKED skips a row another transaction holds; the insert then meets
-- that committed row and does nothing (ON CONFLICT DO NOTHING never waits
-- for a row lock), so a busy key answers FALSE at once. A key with no row
-- (a run's key always has one: schema/12_locks.sql) gets one, so a missing
-- row never makes a claim or the reaper skip a run.
CREATE FUNCTION _try_lock_key(p_key text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM FROM concurrency_keys AS k WHERE k.key = p_key FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN TRUE;
    END IF;
    INSERT INTO concurrency_keys AS k (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION _try_lock_key(text) IS
'Tries a concurrency key''s row lock without waiting (custody step 1); TRUE when held.';

CREATE FUNCTION _lock_keys(p_run_ids text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- concurrency_key never changes after enqueue, so reading it unlocked is safe.
    PERFORM _lock_concurrency_keys(ARRAY(
        SELECT r.concurrency_key
        FROM runs AS r
        WHERE r.run_id = ANY(p_run_ids) AND r.concurrency_key IS NOT NULL
    ));
END;
$$;

COMMENT ON FUNCTION _lock_keys(text[]) IS
'Takes the concurrency-key locks of the given runs in key order (custody step 1).';

-- The key locks themselves, by key name (enqueue_runs names the keys of
-- runs that do not exist yet): each distinct key once, ascending by key
-- COLLATE "C" (the key order of custody step 1).
CREATE FUNCTION _lock_concurrency_keys(p_keys text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text;
BEGIN
    FOR v_key IN
        SELECT DISTINCT k.concurrency_key COLLATE "C" AS key
        FROM unnest(p_keys) AS k (concurrency_key)
        WHERE k.concurrency_key IS NOT NULL
        ORDER BY 1
    LOOP
        PERFORM _lock_key(v_key);
    END LOOP;
END;
$$;

COMMENT ON FUNCTION _lock_concurrency_keys(text[]) IS
'Locks the rows of the given concurrency keys, each once, in key order (custody step 1).';

-- The key lock of one run (custody step 1): one primary-key seek; nothing
-- to lock for a run without a key.
CREATE FUNCTION _lock_key_of(p_run_id text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text;
BEGIN
    SELECT r.concurrency_key INTO v_key FROM runs AS r WHERE r.run_id = p_run_id;
    IF v_key IS NOT NULL THEN
        PERFORM _lock_key(v_key);
    END IF;
END;
$$;

COMMENT ON FUNCTION _lock_key_of(text) IS
'Takes one run''s concurrency-key lock, if it has a key (custody step 1).';

CREATE FUNCTION _lock_run(p_run_id text)
RETURNS runs
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_run runs;
BEGIN
    PERFORM _lock_key_of(p_run_id);
    SELECT r.* INTO v_run FROM runs AS r WHERE r.run_id = p_run_id FOR NO KEY UPDATE;
    RETURN v_run;
END;
$$;

COMMENT ON FUNCTION _lock_run(text) IS
'Takes a run''s custody locks (key, then row), waiting; returns the row as locked, or NULL.';

-- The attempt row, locked; a NULL row when it does not exist.
CREATE FUNCTION _lock_attempt(p_run_id text, p_attempt integer)
RETURNS attempts
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_attempt attempts;
BEGIN
    SELECT a.* INTO v_attempt
    FROM attempts AS a
    WHERE a.run_id = p_run_id AND a.attempt = p_attempt
    FOR NO KEY UPDATE;
    RETURN v_attempt;
END;
$$;

COMMENT ON FUNCTION _lock_attempt(text, integer) IS
'Locks one attempt row (custody step 3); NULL when it does not exist.';

-- Re-read after the locks are held: a fresh statement, so a marker committed
-- while we waited is seen. VOLATILE for that reason.
CREATE FUNCTION _cancel_reason(p_run_id text, OUT requested boolean, OUT reason text)
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    SELECT TRUE, c.reason INTO requested, reason
    FROM cancellations AS c
    WHERE c.run_id = p_run_id;
    requested := coalesce(requested, FALSE);
END;
$$;

COMMENT ON FUNCTION _cancel_reason(text) IS
'Whether a cancel marker exists for the run (read in a fresh snapshot), and its reason.';
