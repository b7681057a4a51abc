-- run_trace_context(): the W3C trace context a run was enqueued with
-- ({"traceparent", "tracestate"?}, see _internal/trace_context.sql), or null:
-- the run has none, or does not exist.
--
-- For tracing workers and relays, which read it in the statement of their
-- claim, so that tracing adds no round trip and changes no SPEC result:
--   SELECT c.*, runrelay.run_trace_context(c.run_id) AS trace_context
--   FROM runrelay.claim_attempts(...) AS c
-- (docs/operations.md, "Tracing", has the form the Python client sends,
-- one call per claimed run). A run's trace context is written once, when
-- the run is created, so any snapshot that sees the run sees its context.
--
-- Reads only: one primary-key probe of runs, no lock, no write. VOLATILE
-- like every API function: called after a claim in the same statement, its
-- query takes a fresh snapshot, so it finds a run the claim took although
-- the run was enqueued after that statement began (the claim's own queries
-- take fresh snapshots too; a STABLE function would use the statement's).
CREATE FUNCTION run_trace_context(run_id text)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('run_id', run_trace_context.run_id);
    RETURN (SELECT r.trace_context FROM runs AS r WHERE r.run_id = run_trace_context.run_id);
END;
$$;

COMMENT ON FUNCTION run_trace_context(text) IS
'The W3C trace context a run was enqueued with, or null (none, or no such run).';
