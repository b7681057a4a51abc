-- Loaded once into the pgTAP database after `alembic upgrade head`: the pgTAP
-- extension and the `tests` schema of fixtures that the numbered files share.
CREATE EXTENSION IF NOT EXISTS pgtap;

CREATE SCHEMA tests;

UPDATE runrelay.settings SET allow_clock_override = TRUE;

-- A bare run row, for constraint tests that must not go through the API.
CREATE FUNCTION tests.insert_run(p_run_id text, p_status text DEFAULT 'queued')
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO runrelay.runs (
        run_id, queue, status, payload, run_at, max_attempts, created_at, updated_at
    )
    VALUES (p_run_id, 'default', p_status, '{}', now(), 3, now(), now());
$$;
