-- _fast_paths(): whether a call may take a fused path or short cut where
-- one exists: settle_and_claim's check of a worker's usual call (one
-- expression for one item, one statement for several), _complete's completion of one item or of a whole batch in one
-- statement, _claim's start of one run in one statement,
-- enqueue_run's check and write of a new run in one statement, and the
-- ledger's two short cuts (a claim that leased does not recompute its lane;
-- ack_ledger's claim_next on a lane with nothing left only recomputes it).
-- Each does what the general steps beside it do, for the calls it takes; a
-- session that sets runrelay.reference_paths to on takes the general steps
-- for every call instead. The tests do, to hold the two to the same
-- outcomes, states, attempts, events and lanes
-- (tests/pgtap/027_settle_and_claim.sql, 066_enqueue_paths.sql,
-- 069_ledger_paths.sql); nothing else needs to. SQL-standard body: the
-- planner inlines it, so the check costs no call.
CREATE FUNCTION _fast_paths()
RETURNS boolean
LANGUAGE sql
VOLATILE
RETURN coalesce(current_setting('runrelay.reference_paths', TRUE), '') <> 'on';

COMMENT ON FUNCTION _fast_paths() IS
'Whether fused fast paths may be taken (false when runrelay.reference_paths is on, for equivalence tests).';
