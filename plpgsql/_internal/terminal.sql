-- _terminal(): whether a run status is one a run ends in (completed, failed,
-- cancelled), the one definition the functions share; runrelay.contract's
-- TERMINAL_STATUSES is its Python twin (tests/python/test_contract.py).
--
-- A SQL-standard body with no SET clause, IMMUTABLE, as _runnable is and for
-- the same reason: the planner inlines it, so `IF _terminal(v_run.status)`
-- and `WHERE _terminal(r.status)` cost what the spelled-out `IN (...)` costs.
-- The rules of the runs table (runs_finished_iff_terminal) and the indexes
-- spell the set out, since they cannot call a function the migrations drop
-- and recreate; the contract test holds them to the same set.
CREATE FUNCTION _terminal(p_status text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN p_status IN ('completed', 'failed', 'cancelled');

COMMENT ON FUNCTION _terminal(text) IS
'Whether a run status is terminal: completed, failed or cancelled (inlined by the planner).';
