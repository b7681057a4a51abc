-- _now() and _clock_now(): the clocks every function reads.
--
-- _now() is statement_timestamp(): the moment the calling statement began,
-- one value for everything a call decides. _clock_now() is clock_timestamp():
-- the moment of reading, for what must not count a lock wait against the
-- caller — a lease granted after the lane lock was awaited starts when it is
-- granted, and the time a lease has left is measured when the call answers.
--
-- Both are shifted by the transaction-local setting runrelay.clock_offset (an
-- interval) when the installation allows it (settings.allow_clock_override,
-- which only the schema owner can set); _now() holds that rule and
-- _clock_now() applies _now()'s shift.
-- Tests move time with SET LOCAL runrelay.clock_offset = '1 hour'; production
-- installations ignore the setting, so no caller can expire or extend a lease
-- by lying about the time. VOLATILE: they read a table.
CREATE FUNCTION _now()
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_offset text := current_setting('runrelay.clock_offset', true);
BEGIN
    -- Called many times per operation: no nested call on the common path.
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

CREATE FUNCTION _clock_now()
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- The same shift as _now(), whatever it is.
    RETURN clock_timestamp() + (_now() - statement_timestamp());
END;
$$;

COMMENT ON FUNCTION _clock_now() IS
'The database clock at this instant: clock_timestamp(), shifted as _now() is.';
