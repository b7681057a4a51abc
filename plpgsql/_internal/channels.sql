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

-- _notifying(kind): the channel of that kind (_channel) while
-- settings.notifications names the kind; no row while it does not. Every
-- notification of the install is sent through it, in the statement that
-- decides to send it:
--   PERFORM pg_notify(n.channel, payload) FROM _notifying('runs') AS n (channel);
-- or joined into a statement that notifies once per row. A set-returning SQL
-- function with a SQL-standard body, STABLE and without a SET clause, so
-- that the planner expands it into that statement: the setting costs no
-- statement and no call of its own (as _ledger_row, ledger_row.sql).
--
-- Why an install may leave kinds out: PostgreSQL commits the transactions
-- that notified one at a time, holding one cluster-wide lock from before
-- the commit until its WAL is flushed, so notifying commits never share a
-- flush. A completion notifies <schema>_terminal and an enqueue
-- <schema>_runs and <schema>_ledger; with four workers on the one-job path
-- a third of the sessions waited on that lock. Notifications are wake-ups
-- only (the loops poll), so an install where nobody listens on a channel
-- can turn it off (docs/configuration.md). Every kind is on by default.
CREATE FUNCTION _notifying(p_kind text)
RETURNS SETOF text
LANGUAGE sql
STABLE
ROWS 1
BEGIN ATOMIC
    SELECT _channel(p_kind) AS channel
    -- The one row by its key (a probe, not a scan). A kind that does not
    -- exist raises (_channel) whether or not it is on.
    WHERE
        (
            SELECT notifications @> ARRAY[p_kind] FROM settings
            WHERE singleton
        )
        OR _channel(p_kind) IS NULL;
END;

COMMENT ON FUNCTION _notifying(text) IS
'The install''s channel of a notification kind while settings.notifications sends that kind, else no row (inlined).';
