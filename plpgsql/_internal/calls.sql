-- Exact replays of signal_run, cancel_run, retry_run and skip_ledger_events
-- by call_id (table calls).
--
-- The protocol, in the caller, before any write:
--   1. _check_call_id() validates the id with the other arguments;
--   2. _recorded_call() takes the call's lock, then looks the id up: the
--      recorded outcome (answer it, write nothing), NULL (a new call), or
--      22023 when the id belongs to another call;
--   3. the call does its work and answers through _record_call(), which
--      records the outcome in the same transaction.
--
-- The call lock (_lock_call_id) makes a repeat that arrives while the first
-- call is still running (the client gave up on a slow reply) wait for it and
-- then answer what it recorded, instead of deciding afresh beside it. It is
-- taken before every custody lock, and a call takes at most one, so it adds
-- no wait-for cycle. It is a row of call_locks (schema/12_locks.sql), a table
-- only these functions can write, so no other login can take or hold it.

-- The call's lock: insert the id into call_locks, then delete it again. The
-- row is never visible outside this transaction, but until it ends its
-- primary-key entry makes a concurrent insert of the same id wait (a unique
-- check waits for an inserter still in progress); after it ends that insert
-- meets a dead entry and goes on. So the table stays empty and a lock is
-- held exactly as long as the transaction, like a transaction-level lock.
CREATE FUNCTION _lock_call_id(p_call_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO call_locks AS l (call_id) VALUES (p_call_id);
    DELETE FROM call_locks AS l WHERE l.call_id = p_call_id;
END;
$$;

COMMENT ON FUNCTION _lock_call_id(uuid) IS
'Takes a call_id''s lock (custody step 0) until the transaction ends, waiting for a concurrent call with that id.';

CREATE FUNCTION _check_call_id(p_call_id uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- The nil uuid is what an unset id looks like in most languages: every
    -- caller that forgot to set one would share it, and all but the first
    -- call would be answered as replays of someone else's call.
    IF p_call_id = '00000000-0000-0000-0000-000000000000'::uuid THEN
        PERFORM _invalid('call_id', 'must not be the nil uuid',
            'Pass a new random uuid for each call (the same one only to repeat that call), or null.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_call_id(uuid) IS
'Validates a call_id: null or any uuid but the nil uuid.';

-- The digest a repeat must match: sha256 of the canonical text of the
-- arguments other than run_id (jsonb prints keys in one canonical order).
CREATE FUNCTION _call_digest(p_arguments jsonb)
RETURNS bytea
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN sha256(convert_to(p_arguments::text, 'UTF8'));
END;
$$;

COMMENT ON FUNCTION _call_digest(jsonb) IS
'The sha256 digest of a call''s arguments, compared when the call is repeated.';

CREATE FUNCTION _recorded_call(p_call_id uuid, p_function text, p_run_id text, p_digest bytea)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_call calls;
BEGIN
    IF p_call_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM _lock_call_id(p_call_id);
    -- A new statement after the lock: a call with this id that committed
    -- while we waited is seen.
    SELECT c.* INTO v_call FROM calls AS c WHERE c.call_id = p_call_id;
    IF v_call.call_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_call.function_name <> p_function THEN
        PERFORM _invalid('call_id', format('%s was already used by a call of %s', p_call_id, v_call.function_name),
            'A call_id names one call: pass a new uuid for a new call, the same one only to repeat that call.');
    END IF;
    IF v_call.run_id <> p_run_id THEN
        PERFORM _invalid('call_id', format('%s was already used by a %s call for another run', p_call_id, p_function),
            'A call_id names one call: pass a new uuid for a new call, the same one only to repeat that call.');
    END IF;
    IF v_call.arguments_digest <> p_digest THEN
        PERFORM _invalid('call_id', format('%s was already used by a %s call for run %s with other %s',
                p_call_id, p_function, _quote(p_run_id),
                CASE p_function
                    WHEN 'signal_run' THEN 'name or payload'
                    WHEN 'retry_run' THEN 'max_attempts, run_at, reason or requested_by'
                    WHEN 'skip_ledger_events' THEN 'lane or reason'
                    ELSE 'reason'
                END),
            'A repeat must pass exactly the arguments of the first call; pass a new uuid for a new call.');
    END IF;
    RETURN v_call.outcome;
END;
$$;

COMMENT ON FUNCTION _recorded_call(uuid, text, text, bytea) IS
'Takes a call_id''s lock and answers what that call recorded; NULL for a new call; 22023 if the id names another call.';

-- p_reply: the row a set-returning call answered, kept when its effect's
-- rows cannot give it again (calls.reply); null for the other calls.
CREATE FUNCTION _record_call(
    p_call_id uuid, p_function text, p_run_id text, p_digest bytea, p_outcome text, p_reply jsonb DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_call_id IS NOT NULL THEN
        INSERT INTO calls (call_id, function_name, run_id, arguments_digest, outcome, called_at, reply)
        VALUES (p_call_id, p_function, p_run_id, p_digest, p_outcome, _now(), p_reply);
    END IF;
    RETURN p_outcome;
END;
$$;

COMMENT ON FUNCTION _record_call(uuid, text, text, bytea, text, jsonb) IS
'Records what a call with a call_id answered (nothing without one) and returns that outcome.';
