-- Input validation. Bad input raises SQLSTATE 22023 (invalid_parameter_value)
-- with a message naming the parameter, the parameter in the COLUMN field (for
-- clients that map errors to arguments) and a HINT with what is allowed; an
-- oversized JSON value raises 54000. Validation runs before any write, so a
-- call that raises changes nothing.

CREATE FUNCTION _invalid(p_parameter text, p_problem text, p_hint text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'runrelay: invalid %: %', p_parameter, p_problem
        USING ERRCODE = 'invalid_parameter_value',
              COLUMN = p_parameter,
              HINT = p_hint;
END;
$$;

COMMENT ON FUNCTION _invalid(text, text, text) IS
'Raises SQLSTATE 22023 naming the parameter, with a hint.';

CREATE FUNCTION _check_id(p_parameter text, p_value text, p_nullable boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF NOT p_nullable THEN
            PERFORM _invalid(p_parameter, 'must not be null',
                'Pass a non-empty identifier of at most 200 characters.');
        END IF;
        RETURN;
    END IF;
    -- [[:space:]] also catches tabs and newlines (btrim() strips only spaces).
    IF length(p_value) > 200 OR p_value ~ '^[[:space:]]*$' THEN
        PERFORM _invalid(p_parameter,
            format('must be 1 to 200 characters and not blank (got %s)', length(p_value)),
            'Pass a non-empty identifier of at most 200 characters.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_id(text, text, boolean) IS
'Validates an identifier: not null (unless nullable), not blank, at most 200 characters.';

CREATE FUNCTION _check_json(
    p_parameter text, p_value jsonb, p_kind text DEFAULT 'any', p_nullable boolean DEFAULT FALSE
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_cap integer;
    v_size integer;
BEGIN
    IF p_value IS NULL THEN
        IF NOT p_nullable THEN
            PERFORM _invalid(p_parameter, 'must not be null',
                format('Pass a JSON %s.', CASE WHEN p_kind = 'any' THEN 'value' ELSE p_kind END));
        END IF;
        RETURN;
    END IF;
    IF p_kind <> 'any' AND jsonb_typeof(p_value) <> p_kind THEN
        PERFORM _invalid(p_parameter,
            format('must be a JSON %s, not %s', p_kind, jsonb_typeof(p_value)),
            format('Pass a JSON %s.', p_kind));
    END IF;
    SELECT s.max_payload_bytes INTO v_cap FROM settings AS s;
    v_size := octet_length(p_value::text);
    -- Nesting is capped too: JSON nested thousands deep is valid to
    -- PostgreSQL but breaks common decoders (Python's json raises
    -- RecursionError near 1000 levels), and a worker would fail only after
    -- its claim committed. 512 levels need at least 1024 bytes.
    IF v_size >= 1024 AND jsonb_path_exists(p_value, 'strict $.**{512}') THEN
        PERFORM _invalid(p_parameter, 'is nested more than 511 levels deep',
            'Flatten the JSON value to at most 511 levels of nesting.');
    END IF;
    IF v_size > v_cap THEN
        RAISE EXCEPTION 'runrelay: % is too large: % bytes, the limit is %', p_parameter, v_size, v_cap
            USING ERRCODE = 'program_limit_exceeded',
                  COLUMN = p_parameter,
                  HINT = 'Store large data elsewhere and pass a reference; the limit is settings.max_payload_bytes.';
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_json(text, jsonb, text, boolean) IS
'Validates a JSON argument: not null (unless nullable), of the expected type, at most 511 levels deep, within the payload cap (54000).';

CREATE FUNCTION _check_int(p_parameter text, p_value integer, p_min integer, p_max integer)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL OR p_value < p_min OR p_value > p_max THEN
        PERFORM _invalid(p_parameter,
            format('must be between %s and %s (got %s)', p_min, p_max, coalesce(p_value::text, 'null')),
            format('Pass an integer from %s to %s.', p_min, p_max));
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_int(text, integer, integer, integer) IS
'Validates an integer argument against an inclusive range; null is invalid.';

CREATE FUNCTION _check_time(p_parameter text, p_value timestamptz, p_nullable boolean DEFAULT TRUE)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF NOT p_nullable THEN
            PERFORM _invalid(p_parameter, 'must not be null', 'Pass a finite timestamp with time zone.');
        END IF;
        RETURN;
    END IF;
    IF NOT isfinite(p_value) THEN
        PERFORM _invalid(p_parameter, format('must be finite (got %s)', p_value),
            'Pass a finite timestamp with time zone.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_time(text, timestamptz, boolean) IS
'Validates a timestamp argument: finite, and not null unless nullable.';

CREATE FUNCTION _check_token(p_attempt integer, p_lease_token uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _check_int('attempt', p_attempt, 1, 2147483647);
    IF p_lease_token IS NULL THEN
        PERFORM _invalid('lease_token', 'must not be null', 'Pass the lease_token that claim_attempts returned.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_token(integer, uuid) IS
'Validates the (attempt, lease_token) pair a fenced write presents.';

-- A reason (cancel_run, release_attempt, a release in settle_and_claim):
-- null, or at most 2000 characters.
CREATE FUNCTION _check_reason(p_parameter text, p_reason text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF length(p_reason) > 2000 THEN
        PERFORM _invalid(p_parameter, format('is %s characters; at most 2000', length(p_reason)),
            'Pass a reason of at most 2000 characters, or null.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_reason(text, text) IS
'Validates a reason: null, or at most 2000 characters.';

-- A claim's queue list (claim_attempts, settle_and_claim): null for every
-- queue, else 1 to 100 queue names; returns them without duplicates.
CREATE FUNCTION _check_queues(p_queues text[])
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_queue text;
    v_queues text[];
BEGIN
    IF p_queues IS NULL THEN
        RETURN NULL;
    END IF;
    IF cardinality(p_queues) NOT BETWEEN 1 AND 100 OR array_ndims(p_queues) > 1 THEN
        PERFORM _invalid('queues',
            'must be a one-dimensional array of 1 to 100 queue names, or null for every queue',
            'Pass null to claim from every queue, or a non-empty array of queue names.');
    END IF;
    FOREACH v_queue IN ARRAY p_queues LOOP
        PERFORM _check_id('queues', v_queue);
    END LOOP;
    SELECT array_agg(DISTINCT q.name) INTO v_queues FROM unnest(p_queues) AS q (name);
    RETURN v_queues;
END;
$$;

COMMENT ON FUNCTION _check_queues(text[]) IS
'Validates a claim''s queue list (null, or 1 to 100 queue names) and returns it without duplicates.';

-- A run status filter (list_runs): null for every status, else one of the
-- six statuses of a run.
CREATE FUNCTION _check_status(p_parameter text, p_status text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_status NOT IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled') THEN
        PERFORM _invalid(p_parameter, format('unknown run status %s', p_status),
            'Pass null, or one of queued, running, waiting, completed, failed, cancelled.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_status(text, text) IS
'Validates a run status filter: null, or one of the six run statuses.';

-- Lease lengths are clamped, not rejected (SPEC §5): null means the default.
-- PL/pgSQL rather than SQL for the reason given at _lock_key.
CREATE FUNCTION _lease(p_seconds integer)
RETURNS interval
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN make_interval(secs => least(300, greatest(5, coalesce(p_seconds, 30))));
END;
$$;

COMMENT ON FUNCTION _lease(integer) IS
'A lease length in seconds clamped to 5..300 (null: 30), as an interval.';

CREATE FUNCTION _check_lane(p_lane text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_lane IS NULL OR p_lane NOT IN ('lifecycle', 'observability') THEN
        PERFORM _invalid('lane', format('unknown lane %s', coalesce(p_lane, 'null')),
            'Pass lifecycle or observability.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_lane(text) IS
'Validates a lane name: lifecycle or observability.';

CREATE FUNCTION _check_event_ids(p_event_ids bigint[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_event_ids IS NULL OR array_ndims(p_event_ids) > 1 OR cardinality(p_event_ids) > 10000 THEN
        PERFORM _invalid('event_ids', 'must be a one-dimensional array of at most 10000 event ids',
            'Pass the event_id values a claim returned.');
    END IF;
    IF array_position(p_event_ids, NULL) IS NOT NULL THEN
        PERFORM _invalid('event_ids', 'must not contain null',
            'Pass the event_id values a claim returned.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_event_ids(bigint[]) IS
'Validates an event_ids argument: not null, no null element, at most 10000 ids.';

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
    length(p_run_id) <= 200 AND p_run_id !~ '^[[:space:]]*$'
    AND length(p_queue) <= 200 AND p_queue !~ '^[[:space:]]*$'
    AND octet_length(p_payload::text) <= p_max_payload_bytes
    AND (octet_length(p_payload::text) < 1024 OR NOT jsonb_path_exists(p_payload, 'strict $.**{512}'))
    AND (p_run_at IS NULL OR isfinite(p_run_at))
    AND p_priority BETWEEN -1000000 AND 1000000
    AND p_max_attempts BETWEEN 1 AND 1000
    AND p_payload_retention IN ('keep', 'drop_on_delivery')
    AND (p_concurrency_key IS NULL OR (length(p_concurrency_key) <= 200 AND p_concurrency_key !~ '^[[:space:]]*$')),
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
        'trace_context'
    ]) <> '{}'::jsonb
    OR jsonb_typeof(p_item -> 'run_id') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'queue') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'run_at') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'payload_retention') NOT IN ('string', 'null')
    OR jsonb_typeof(p_item -> 'concurrency_key') NOT IN ('string', 'null')
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
    PERFORM _check_id(p_prefix || 'queue', p_queue);
    PERFORM _check_json(p_prefix || 'payload', p_payload);
    PERFORM _check_time(p_prefix || 'run_at', p_run_at);
    PERFORM _check_int(p_prefix || 'priority', p_priority, -1000000, 1000000);
    PERFORM _check_int(p_prefix || 'max_attempts', p_max_attempts, 1, 1000);
    IF p_payload_retention IS NULL OR p_payload_retention NOT IN ('keep', 'drop_on_delivery') THEN
        PERFORM _invalid(p_prefix || 'payload_retention',
            format('must be keep or drop_on_delivery (got %s)', coalesce(p_payload_retention, 'null')),
            'Pass keep or drop_on_delivery.');
    END IF;
    PERFORM _check_id(p_prefix || 'concurrency_key', p_concurrency_key, TRUE);
END;
$$;

COMMENT ON FUNCTION _check_enqueue(text, text, text, jsonb, timestamptz, integer, integer, text, text) IS
'Validates the arguments of one enqueue (enqueue_run, or an item of enqueue_runs), naming the parameter.';

-- An enqueue of an existing run_id with another queue or payload.
CREATE FUNCTION _enqueue_conflict(p_parameter text, p_run_id text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _invalid(p_parameter,
        format('run %s already exists with a different queue or payload', p_run_id),
        'Repeat an enqueue with the same queue and payload, or choose a new run_id.');
END;
$$;

COMMENT ON FUNCTION _enqueue_conflict(text, text) IS
'Raises 22023: the run_id names an existing run with another queue or payload.';

-- The fields every item of a batch of fenced writes names its attempt by
-- (complete_attempts, settle_and_claim): run_id, attempt and lease_token,
-- each run at most once (p_seen: the run_ids of the items before it). The
-- error names the batch parameter and the item's position.
CREATE FUNCTION _check_item(p_parameter text, p_index integer, p_item jsonb, p_seen text[], p_hint text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF jsonb_typeof(p_item) <> 'object'
        OR jsonb_typeof(p_item -> 'run_id') IS DISTINCT FROM 'string'
        OR jsonb_typeof(p_item -> 'attempt') IS DISTINCT FROM 'number'
        OR jsonb_typeof(p_item -> 'lease_token') IS DISTINCT FROM 'string' THEN
        PERFORM _invalid(p_parameter, format(
            'item %s needs run_id (a string), attempt (a number) and lease_token (a uuid string)', p_index
        ), p_hint);
    END IF;
    IF length(p_item ->> 'run_id') > 200 OR (p_item ->> 'run_id') ~ '^[[:space:]]*$' THEN
        PERFORM _invalid(p_parameter, format(
            'item %s: run_id must be 1 to 200 characters and not blank (got %s)', p_index, length(p_item ->> 'run_id')
        ), p_hint);
    END IF;
    IF (p_item ->> 'attempt') !~ '^[0-9]{1,9}$' OR (p_item ->> 'attempt')::integer < 1 THEN
        PERFORM _invalid(p_parameter, format('item %s: attempt must be a positive integer', p_index), p_hint);
    END IF;
    IF (p_item ->> 'lease_token') !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
        PERFORM _invalid(p_parameter, format('item %s: lease_token is not a uuid', p_index), p_hint);
    END IF;
    IF (p_item ->> 'run_id') = ANY(p_seen) THEN
        PERFORM _invalid(p_parameter, format('item %s repeats run_id %L', p_index, p_item ->> 'run_id'), p_hint);
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_item(text, integer, jsonb, text[], text) IS
'Validates the run_id, attempt and lease_token of one item of a batch, and that its run is not repeated.';
