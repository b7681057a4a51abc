-- _runnable(): the runnable rule, the one definition every claim path, the
-- run_stats view and the claim indexes share. A run is runnable when it is
-- queued, not held behind an earlier run of its concurrency key, and due.
--
-- Written as a SQL-standard body (RETURN ...), with no SET clause and no
-- SECURITY DEFINER, so that the planner inlines it: a query that says
-- `_runnable(r.status, r.key_held, r.run_at, v_now)` is planned exactly as if
-- it had spelled out the three conditions, and still matches the partial
-- claim indexes (runs_claim_queue_idx, runs_claim_any_idx). A SET clause
-- would stop the inlining and every claim would scan the backlog. Nothing
-- here needs a search_path: a SQL-standard body is parsed when the function
-- is created, and it names only built-in operators.
--
-- IMMUTABLE, unlike every other function of the schema (which are VOLATILE so
-- that they never reuse a caller's snapshot): it reads no state, only its
-- arguments. The declaration matters: the planner decides whether to fold a
-- WITH query into the statement that uses it before it inlines functions, and
-- never folds one that calls a VOLATILE function; claim_attempts' `fresh`
-- query must fold, or its UPDATE reads the whole runs table.
--
-- The claim indexes cannot call a function (the migrations drop and recreate
-- every function, which an index depending on one would block), so their
-- predicate spells out the part of this rule that does not involve time;
-- tests/python/test_rule_homes.py proves the two agree on every status.
CREATE FUNCTION _runnable(
    p_status text, p_key_held boolean, p_run_at timestamptz, p_now timestamptz
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN p_status = 'queued' AND NOT p_key_held AND p_run_at <= p_now;

COMMENT ON FUNCTION _runnable(text, boolean, timestamptz, timestamptz) IS
'The runnable rule: queued, not held behind its concurrency key, and due at p_now (inlined by the planner).';
