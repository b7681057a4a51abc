-- _require_read_committed(): every public function calls this first.
--
-- The cancel-marker and fence re-checks rely on each statement taking a fresh
-- snapshot after the custody locks are held; under REPEATABLE READ or
-- SERIALIZABLE the transaction snapshot would hide a marker committed while we
-- waited for a lock.
CREATE FUNCTION _require_read_committed()
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'runrelay functions require READ COMMITTED isolation, not %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'Call runrelay functions in autocommit or in a READ COMMITTED transaction.';
    END IF;
END;
$$;

COMMENT ON FUNCTION _require_read_committed() IS
'Raises SQLSTATE 25000 unless the transaction runs at READ COMMITTED.';
