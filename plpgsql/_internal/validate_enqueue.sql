-- The rules of enqueue arguments (enqueue_run's, and each item of
-- enqueue_runs): one inlined expression that passes valid arguments
-- (_enqueue_valid, _enqueue_item_well_formed), the checks that word the
-- error when it does not (_check_enqueue), and the error of a run_id
-- enqueued again with other arguments (_enqueue_conflict). Built on the
-- value checks of validate.sql, so this file comes after it.

-- Whether the arguments of one enqueue pass every check of _check_enqueue
-- below, as one expression: the common case (every argument valid) costs
-- one inlined test instead of eight helper calls, and enqueue_runs tests all
-- its items in one statement. _check_enqueue returns at once when this is
-- true, so this is the rule for valid arguments and the checks below it
-- only word the error: a case this wrongly let through would be accepted by
-- enqueue_run too, which the bad-input tests of both functions would catch.
-- p_max_payload_bytes: settings.max_payload_bytes, read once by the caller.
-- IMMUTABLE SQL with a SQL-standard body, so the planner inlines it.
CREATE FUNCTION _enqueue_valid(
    p_run_id text,
    p_queue text,
    p_payload jsonb,
    p_run_at timestamptz,
    p_priority integer,
    p_max_attempts integer,
    p_payload_retention text,
    p_concurrency_key text,
    p_max_payload_bytes integer
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN coalesce(
    _id_valid(p_run_id) AND NOT _run_id_reserved(p_run_id)
    AND _id_valid(p_queue)
    AND octet_length(p_payload::text) <= p_max_payload_bytes
    AND (octet_length(p_payload::text) < 1024 OR NOT jsonb_path_exists(p_payload, 'strict $.**{512}'))
    AND (p_run_at IS NULL OR isfinite(p_run_at))
    AND p_priority BETWEEN -1000000 AND 1000000
    AND p_max_attempts BETWEEN 1 AND 1000
    AND p_payload_retention IN ('keep', 'drop_on_delivery')
    AND (p_concurrency_key IS NULL OR _id_valid(p_concurrency_key)),
    FALSE
);

COMMENT ON FUNCTION _enqueue_valid(text, text, jsonb, timestamptz, integer, integer, text, text, integer) IS
'Whether the arguments of one enqueue pass every check of _check_enqueue (inlined); false for any invalid one.';

-- Whether an item of enqueue_runs has the shape of enqueue_run's arguments:
-- an object of known keys, each a JSON value of its parameter's type (or
-- null), integers of at most 9 digits; the optional trace_context an object
-- or null (its contents are _trace_context_valid's). Which key is wrong
-- enqueue_runs works out only when this is false. IMMUTABLE SQL, inlined.
CREATE FUNCTION _enqueue_item_well_formed(p_item jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN (
    jsonb_typeof(p_item) IS DISTINCT FROM 'object'
    OR (p_item - ARRAY[
        'run_id', 'queue', 'payload', 'run_at', 'priority', 'max_attempts', 'payload_retention', 'concurrency_key',
        'task', 'trace_context'
    ]) <> '{}'::jsonb
    OR jsonb_typeof(p_item -> 'run_id') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'queue') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'run_at') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'payload_retention') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'concurrency_key') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'task') NOT IN ('string', 'null')
    OR (
        jsonb_typeof(p_item -> 'priority') = 'number'
        AND (p_item ->> 'priority') !~ '^-?[0-9]{1,9}$'
    )
    OR jsonb_typeof(p_item -> 'priority') NOT IN ('number', 'null')
    OR (
        jsonb_typeof(p_item -> 'max_attempts') = 'number'
        AND (p_item ->> 'max_attempts') !~ '^-?[0-9]{1,9}$'
    )
    OR jsonb_typeof(p_item -> 'max_attempts') NOT IN ('number', 'null')
    OR jsonb_typeof(p_item -> 'trace_context') NOT IN ('object', 'null')
) IS NOT TRUE;

COMMENT ON FUNCTION _enqueue_item_well_formed(jsonb) IS
'Whether an enqueue_runs item is an object of enqueue_run''s parameters (and trace_context), each of its JSON type (inlined).';

-- The arguments of one enqueue (enqueue_run's, or one item of enqueue_runs),
-- each checked by the helpers above. p_prefix goes before every parameter
-- name: '' for enqueue_run, 'items[3].' for an item of enqueue_runs.
CREATE FUNCTION _check_enqueue(
    p_prefix text,
    p_run_id text,
    p_queue text,
    p_payload jsonb,
    p_run_at timestamptz,
    p_priority integer,
    p_max_attempts integer,
    p_payload_retention text,
    p_concurrency_key text
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF _enqueue_valid(
        p_run_id, p_queue, p_payload, p_run_at, p_priority, p_max_attempts, p_payload_retention,
        p_concurrency_key, (SELECT s.max_payload_bytes FROM settings AS s)
    ) THEN
        RETURN;
    END IF;
    PERFORM _check_id(p_prefix || 'run_id', p_run_id);
    IF _run_id_reserved(p_run_id) THEN
        PERFORM _invalid(p_prefix || 'run_id',
            format('%s is in the schedule: namespace, reserved for the runs of schedules', _quote(p_run_id)),
            'Choose a run_id that does not start with schedule:; a schedule (upsert_schedule) creates those runs.');
    END IF;
    PERFORM _check_id(p_prefix || 'queue', p_queue);
    PERFORM _check_json(p_prefix || 'payload', p_payload);
    PERFORM _check_time(p_prefix || 'run_at', p_run_at);
    PERFORM _check_int(p_prefix || 'priority', p_priority, -1000000, 1000000);
    PERFORM _check_int(p_prefix || 'max_attempts', p_max_attempts, 1, 1000);
    IF p_payload_retention IS NULL OR p_payload_retention NOT IN ('keep', 'drop_on_delivery') THEN
        PERFORM _invalid(p_prefix || 'payload_retention',
            format('must be keep or drop_on_delivery (got %s)', _quote(p_payload_retention)),
            'Pass keep or drop_on_delivery.');
    END IF;
    PERFORM _check_id(p_prefix || 'concurrency_key', p_concurrency_key, TRUE);
END;
$$;

COMMENT ON FUNCTION _check_enqueue(text, text, text, jsonb, timestamptz, integer, integer, text, text) IS
'Validates the arguments of one enqueue (enqueue_run, or an item of enqueue_runs), naming the parameter.';

-- An enqueue of an existing run_id with another queue, payload or task.
CREATE FUNCTION _enqueue_conflict(p_parameter text, p_run_id text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _invalid(p_parameter,
        format('run %s already exists with a different queue or payload (or task)', _quote(p_run_id)),
        'Repeat an enqueue with the same queue, task and payload, or choose a new run_id.');
END;
$$;

COMMENT ON FUNCTION _enqueue_conflict(text, text) IS
'Raises 22023: the run_id names an existing run with another queue or payload.';
