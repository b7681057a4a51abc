-- get_schema_version(): the Alembic revision whose functions are installed.
-- Clients compare it with the revision they were built for. It reads the
-- install's own alembic_version table (same schema, one row), so no revision
-- writes its number into code. Alembic creates that table before the first
-- revision runs, so it exists when this LANGUAGE sql body is validated.
CREATE FUNCTION get_schema_version()
RETURNS text
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT v.version_num::text FROM alembic_version AS v;
$$;

COMMENT ON FUNCTION get_schema_version() IS
'The Alembic revision of the installed runrelay functions.';
