-- _channel(kind): the name of one of the install's NOTIFY channels, the one
-- home of those names in SQL.
--
-- An install notifies on four channels: <schema>_runs (a queue has runnable
-- work), <schema>_ledger (a run's lane has events to deliver),
-- <schema>_terminal (a run ended) and <schema>_delivered (events were
-- acknowledged). NOTIFY is database-wide, so the install's schema is part of
-- the name: two installs in one database (runrelay migrate --schema billing)
-- never wake each other's loops. The default install's names are
-- runrelay_runs, runrelay_ledger, runrelay_terminal and runrelay_delivered.
-- The schema is current_schema() under the pinned search_path, which is the
-- install's schema. The Python client builds the same names
-- (runrelay._backoff.channel); tests/python/test_loops.py
-- (test_channel_names_are_the_same_in_sql_and_python) keeps the two equal.
CREATE FUNCTION _channel(p_kind text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_kind IN ('runs', 'ledger', 'terminal', 'delivered') THEN
        RETURN current_schema() || '_' || p_kind;
    END IF;
    RAISE EXCEPTION 'no NOTIFY channel of kind %', quote_nullable(p_kind)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'The kinds are runs, ledger, terminal and delivered.';
END;
$$;

COMMENT ON FUNCTION _channel(text) IS
'The name of one of the install''s NOTIFY channels: <schema>_runs, _ledger, _terminal or _delivered.';
