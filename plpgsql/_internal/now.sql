-- The database clock: the _clock view, _now() and _clock_now().
--
-- _now() is statement_timestamp(): the moment the calling statement began,
-- one value for everything a call decides. _clock_now() is clock_timestamp():
-- the moment of reading, for what must not count a lock wait against the
-- caller — a lease granted after the lane lock was awaited starts when it is
-- granted, and the time a lease has left is measured when the call answers.
--
-- Both are shifted by the transaction-local setting runrelay.clock_offset (an
-- interval) when the installation allows it (settings.allow_clock_override,
-- which only the schema owner can set). The _clock view is the one home of
-- that rule: _now() reads it whenever an offset is set, and the stats views
-- join it. A view, not a function, because a view reads what its owner may
-- read while the functions a view calls run with its reader's privileges, and
-- the admin role that reads the stats views may execute no helper.
-- Tests move time with SET LOCAL runrelay.clock_offset = '1 hour'; production
-- installations ignore the setting, so no caller can expire or extend a lease
-- by lying about the time.
CREATE VIEW _clock AS
SELECT
    CASE
        WHEN
            s.allow_clock_override
            AND coalesce(current_setting('runrelay.clock_offset', TRUE), '') <> ''
            THEN
                statement_timestamp()
                + current_setting('runrelay.clock_offset', TRUE)::interval
        ELSE statement_timestamp()
    END AS now
FROM settings AS s;

COMMENT ON VIEW _clock IS
'The database clock: statement_timestamp(), shifted by runrelay.clock_offset only where settings.allow_clock_override is set.';

-- VOLATILE: it reads a table.
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
    RETURN (SELECT c.now FROM _clock AS c);
END;
$$;

COMMENT ON FUNCTION _now() IS
'The database clock (the _clock view), without reading a table when no offset is set.';

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
