-- Input validation. Bad input raises SQLSTATE 22023 (invalid_parameter_value)
-- with a message naming the parameter, the parameter in the COLUMN field (for
-- clients that map errors to arguments) and a HINT with what is allowed; an
-- oversized JSON value raises 54000. Validation runs before any write, so a
-- call that raises changes nothing.

-- How an error shows a caller's value: every message that names a value
-- the caller passed quotes it with _quote, never whole. A rejected value
-- may be megabytes long or carry terminal escape sequences, and the
-- message goes back to the caller and into the server log (and from there
-- to an operator's terminal), so at most its first 40 characters are shown,
-- in double quotes, with control characters, bidirectional-text controls,
-- backslashes and double quotes escaped; a longer value ends in an
-- ellipsis and its length. _invalid also escapes control characters in the
-- whole message and cuts it at 400 characters, a backstop for a message
-- that interpolates a value without _quote.

-- p_text with every C0/C1 control character, DEL and bidirectional-text
-- control written as \xNN or \uNNNN (and, with p_quote, backslash and
-- double quote escaped). Only error paths call it.
CREATE FUNCTION _escape_text(p_text text, p_quote boolean DEFAULT FALSE)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_out text := '';
    v_char text;
    v_code integer;
BEGIN
    IF p_text !~ '[\x01-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\\"]' THEN
        RETURN p_text;
    END IF;
    FOR v_i IN 1 .. length(p_text) LOOP
        v_char := substr(p_text, v_i, 1);
        v_code := ascii(v_char);
        IF v_code < 32 OR v_code BETWEEN 127 AND 159 THEN
            v_out := v_out || '\x' || lpad(to_hex(v_code), 2, '0');
        ELSIF v_code IN (8206, 8207) OR v_code BETWEEN 8234 AND 8238 OR v_code BETWEEN 8294 AND 8297 THEN
            v_out := v_out || '\u' || lpad(to_hex(v_code), 4, '0');
        ELSIF p_quote AND v_char IN ('\', '"') THEN
            v_out := v_out || '\' || v_char;
        ELSE
            v_out := v_out || v_char;
        END IF;
    END LOOP;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION _escape_text(text, boolean) IS
'Escapes control and bidirectional-text characters (and optionally backslash and double quote) for an error message.';

-- A caller's value as an error message shows it: "first 40 characters"
-- escaped, then "... (N characters)" when longer; null as null.
CREATE FUNCTION _quote(p_value text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL THEN
        RETURN 'null';
    END IF;
    IF length(p_value) <= 40 THEN
        RETURN '"' || _escape_text(p_value, TRUE) || '"';
    END IF;
    RETURN format('"%s..." (%s characters)', _escape_text(left(p_value, 40), TRUE), length(p_value));
END;
$$;

COMMENT ON FUNCTION _quote(text) IS
'A caller''s value as an error message quotes it: at most 40 characters, escaped, with the length when cut.';

CREATE FUNCTION _invalid(p_parameter text, p_problem text, p_hint text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_problem text := _escape_text(left(p_problem, 400));
BEGIN
    IF length(p_problem) > 400 THEN
        v_problem := v_problem || '...';
    END IF;
    RAISE EXCEPTION 'runrelay: invalid %: %', p_parameter, v_problem
        USING ERRCODE = 'invalid_parameter_value',
              COLUMN = p_parameter,
              HINT = p_hint;
END;
$$;

COMMENT ON FUNCTION _invalid(text, text, text) IS
'Raises SQLSTATE 22023 naming the parameter, with a hint; the message escaped and at most 400 characters.';

-- The identifier rule, for every name a caller passes (run_id, queue,
-- concurrency_key, worker, relay, signal and schedule names, and any future
-- task name): at most 200 characters; no C0 or C1 control character or DEL
-- (they would reach operators' terminals and logs as escape sequences); not
-- blank, where blank is only Unicode white space or invisible characters
-- (NBSP, the U+2000 spaces, ideographic space, zero-width space, BOM).
-- Other non-ASCII text is fine ('café', '注文-1'). Null for null.
-- IMMUTABLE SQL with a SQL-standard body, so the planner inlines it.
CREATE FUNCTION _id_valid(p_value text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN (
    length(p_value) <= 200
    AND p_value !~ '[\x01-\x1f\x7f-\x9f]'
    AND p_value !~ '^[\s\u00a0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]*$'
);

COMMENT ON FUNCTION _id_valid(text) IS
'Whether a text is a valid identifier: 1 to 200 characters, no control character, not blank (inlined).';

-- Reserved namespaces. Run ids starting schedule: belong to the schedule
-- path (_schedule_run_id names a slot's run so), so a caller cannot
-- enqueue a slot's run first and pre-empt it. Event types starting run.
-- are the engine's lifecycle events, so a producer or worker cannot forge
-- run.completed ahead of the real one.
CREATE FUNCTION _run_id_reserved(p_run_id text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN starts_with(p_run_id, 'schedule:');

COMMENT ON FUNCTION _run_id_reserved(text) IS
'Whether a run_id is in the schedule: namespace, which only schedules create (inlined).';

CREATE FUNCTION _event_type_reserved(p_type text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN starts_with(p_type, 'run.') OR starts_with(p_type, 'step.');

COMMENT ON FUNCTION _event_type_reserved(text) IS
'Whether an event type is in a namespace of the engine''s events, run. (lifecycle) or step. (record_step) (inlined).';

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
    IF _id_valid(p_value) THEN
        RETURN;
    END IF;
    IF length(p_value) > 200 THEN
        PERFORM _invalid(p_parameter,
            format('must be 1 to 200 characters and not blank (got %s)', length(p_value)),
            'Pass a non-empty identifier of at most 200 characters.');
    END IF;
    IF p_value ~ '[\x01-\x1f\x7f-\x9f]' THEN
        PERFORM _invalid(p_parameter, format('must not contain control characters (got %s)', _quote(p_value)),
            'Pass an identifier without control characters (U+0000 to U+001F, U+007F to U+009F).');
    END IF;
    PERFORM _invalid(p_parameter, format('must be 1 to 200 characters and not blank (got %s)', _quote(p_value)),
        'Pass an identifier with at least one character that is not white space.');
END;
$$;

COMMENT ON FUNCTION _check_id(text, text, boolean) IS
'Validates an identifier (_id_valid): not null (unless nullable), at most 200 characters, no control character, not blank.';

-- The payload cap's error (54000), for one JSON argument (_check_json) or a
-- whole batch (enqueue_runs' items): the size and the cap, never the value.
CREATE FUNCTION _too_large(p_parameter text, p_size bigint, p_cap integer)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'runrelay: % is too large: % bytes, the limit is %', p_parameter, p_size, p_cap
        USING ERRCODE = 'program_limit_exceeded',
              COLUMN = p_parameter,
              HINT = 'Store large data elsewhere and pass a reference; the limit is settings.max_payload_bytes.';
END;
$$;

COMMENT ON FUNCTION _too_large(text, bigint, integer) IS
'Raises SQLSTATE 54000: a JSON argument is over settings.max_payload_bytes.';

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
        PERFORM _too_large(p_parameter, v_size, v_cap);
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

-- A claim's queue list or task list (claim_attempts, settle_and_claim:
-- parameter 'queues', noun 'queue'; 'tasks', 'task'): null for every one,
-- else 1 to 100 names; returns them without duplicates.
CREATE FUNCTION _check_names(p_parameter text, p_names text[], p_noun text)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_name text;
    v_names text[];
BEGIN
    IF p_names IS NULL THEN
        RETURN NULL;
    END IF;
    IF cardinality(p_names) NOT BETWEEN 1 AND 100 OR array_ndims(p_names) > 1 THEN
        PERFORM _invalid(p_parameter,
            format('must be a one-dimensional array of 1 to 100 %s names, or null for every %s', p_noun, p_noun),
            format('Pass null to claim from every %s, or a non-empty array of %s names.', p_noun, p_noun));
    END IF;
    -- Checked by the rule itself (inlined, no statement); _check_id only
    -- to say what is wrong with a name that breaks it. One name (a worker's
    -- usual list) needs no de-duplication.
    FOREACH v_name IN ARRAY p_names LOOP
        IF NOT coalesce(_id_valid(v_name), FALSE) THEN
            PERFORM _check_id(p_parameter, v_name);
        END IF;
    END LOOP;
    IF cardinality(p_names) = 1 THEN
        RETURN ARRAY[p_names[array_lower(p_names, 1)]];
    END IF;
    SELECT array_agg(DISTINCT q.name) INTO v_names FROM unnest(p_names) AS q (name);
    RETURN v_names;
END;
$$;

COMMENT ON FUNCTION _check_names(text, text[], text) IS
'Validates a claim''s list of queue or task names (null, or 1 to 100 names) and returns it without duplicates.';

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
        PERFORM _invalid(p_parameter, format('unknown run status %s', _quote(p_status)),
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
        PERFORM _invalid('lane', format('unknown lane %s', _quote(p_lane)),
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
    IF NOT _id_valid(p_item ->> 'run_id') THEN
        PERFORM _invalid(p_parameter, format(
            'item %s: run_id must be 1 to 200 characters, not blank, without control characters (got %s)',
            p_index, _quote(p_item ->> 'run_id')
        ), p_hint);
    END IF;
    IF (p_item ->> 'attempt') !~ '^[0-9]{1,9}$' OR (p_item ->> 'attempt')::integer < 1 THEN
        PERFORM _invalid(p_parameter, format('item %s: attempt must be a positive integer', p_index), p_hint);
    END IF;
    IF (p_item ->> 'lease_token') !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
        PERFORM _invalid(p_parameter, format('item %s: lease_token is not a uuid', p_index), p_hint);
    END IF;
    IF (p_item ->> 'run_id') = ANY(p_seen) THEN
        PERFORM _invalid(p_parameter, format('item %s repeats run_id %s', p_index, _quote(p_item ->> 'run_id')), p_hint);
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_item(text, integer, jsonb, text[], text) IS
'Validates the run_id, attempt and lease_token of one item of a batch, and that its run is not repeated.';
