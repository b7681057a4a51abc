-- _channel(kind): the name of one of the install's NOTIFY channels, the one
-- home of those names in SQL.
--
-- An install notifies on five channels: <schema>_runs (a queue has runnable
-- work), <schema>_ledger (a run's lane has events to deliver),
-- <schema>_terminal (a run ended), <schema>_delivered (events were
-- acknowledged) and <schema>_cancel (a run was cancelled while a worker's
-- handler runs it: JSON {run_id, attempt, worker}, so that the worker stops
-- the handler at once rather than at its next heartbeat). NOTIFY is database-wide, so the install's schema is part of
-- the name: two installs in one database (runrelay migrate --schema billing)
-- never wake each other's loops. The default install's names are
-- runrelay_runs, runrelay_ledger, runrelay_terminal, runrelay_delivered and
-- runrelay_cancel.
-- The schema is current_schema() under the pinned search_path, which is the
-- install's schema. The Python client builds the same names
-- (runrelay.contract.channel); tests/python/test_loops.py
-- (test_channel_names_are_the_same_in_sql_and_python) keeps the two equal.
CREATE FUNCTION _channel(p_kind text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_kind IN ('runs', 'ledger', 'terminal', 'delivered', 'cancel') THEN
        RETURN current_schema() || '_' || p_kind;
    END IF;
    RAISE EXCEPTION 'no NOTIFY channel of kind %', quote_nullable(p_kind)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'The kinds are runs, ledger, terminal, delivered and cancel.';
END;
$$;

COMMENT ON FUNCTION _channel(text) IS
'The name of one of the install''s NOTIFY channels: <schema>_runs, _ledger, _terminal, _delivered or _cancel.';
