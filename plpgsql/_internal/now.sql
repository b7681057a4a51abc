-- _now(): the one clock every function reads.
--
-- statement_timestamp(), shifted by the transaction-local setting
-- runrelay.clock_offset (an interval) when the installation allows it
-- (settings.allow_clock_override, which only the schema owner can set). Tests
-- move time with SET LOCAL runrelay.clock_offset = '1 hour'; production
-- installations ignore the setting, so no caller can expire or extend a lease
-- by lying about the time. VOLATILE: it reads a table.
CREATE FUNCTION _now()
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_offset text := current_setting('runrelay.clock_offset', true);
BEGIN
    IF v_offset IS NULL OR v_offset = '' THEN
        RETURN statement_timestamp();
    END IF;
    IF NOT (SELECT s.allow_clock_override FROM settings AS s) THEN
        RETURN statement_timestamp();
    END IF;
    RETURN statement_timestamp() + v_offset::interval;
END;
$$;

COMMENT ON FUNCTION _now() IS
'The database clock: statement_timestamp(), shifted by runrelay.clock_offset only where settings.allow_clock_override is set.';
