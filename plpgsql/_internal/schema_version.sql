-- get_schema_version(): the Alembic revision whose functions are installed.
-- Clients compare it with the revision they were built for. Rewritten by
-- `make freeze` for each new revision.
CREATE FUNCTION get_schema_version()
RETURNS text
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT '0007'::text;
$$;

COMMENT ON FUNCTION get_schema_version() IS
'The Alembic revision of the installed runrelay functions.';
