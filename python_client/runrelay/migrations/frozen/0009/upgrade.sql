-- Revision 0009, table changes. Each change has its own section, delimited
-- by a header and an end line, so that sections written separately merge
-- side by side.

-- ==== operators' listings ==================================================
-- list_runs and purge_runs read runs by (queue, status, created_at) and by
-- (concurrency_key, created_at), leaving out running runs so that a claim
-- writes no entry (plpgsql/schema/02_runs.sql). Built inside the migration's
-- transaction: writers of runs wait for the build (one pass over the table).
CREATE INDEX runs_list_idx ON runs (queue, status, created_at, run_id) INCLUDE (finished_at)
WHERE status <> 'running';

CREATE INDEX runs_key_list_idx ON runs (concurrency_key, created_at, run_id)
WHERE concurrency_key IS NOT NULL AND status <> 'running';
-- ==== end: operators' listings =============================================
