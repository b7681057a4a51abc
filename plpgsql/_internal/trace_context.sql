-- Trace context: the W3C Trace Context a producer's tracing gives a run at
-- enqueue, kept in runs.trace_context so that the workers that run it and
-- the relays that deliver its events continue the producer's trace, and one
-- trace shows the run from its enqueue to the consumer's receipt
-- (docs/operations.md, "Tracing").
--
-- Shape: a JSON object {"traceparent": t, "tracestate": s}, tracestate
-- optional (absent or null: none), no other key. t is a version-00 W3C
-- traceparent, 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags> in lower
-- case, neither id all zeros (the W3C's invalid values); s is at most 512
-- printable ASCII characters, as an HTTP header value must be (a relay's
-- webhook sink sends the trace on in headers). runrelay checks the shape and
-- stores the object as given; what the ids mean is the clients' business.
--
-- Two ways in, both checked here (22023 naming where the bad value came
-- from, nothing written):
--   * the transaction-local setting runrelay.trace_context, JSON text:
--     SET LOCAL runrelay.trace_context = '{"traceparent": "00-..."}' before
--     enqueue_run or enqueue_runs, in the enqueue's transaction. Unset or ''
--     (what a session that once set it reads after its transaction ended)
--     is no context. Any language's driver can do this, so any language can
--     carry a trace;
--   * the optional key trace_context of an enqueue_runs item, which wins
--     over the setting for its item (JSON null: no context).

-- Whether a trace context has the shape above; null (no context) is valid.
-- IMMUTABLE SQL with a SQL-standard body, so the planner inlines it into
-- enqueue_runs' one-statement check of all its items. _check_trace_context
-- only words the error when this is false.
CREATE FUNCTION _trace_context_valid(p_value jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN p_value IS NULL OR coalesce(
    jsonb_typeof(p_value) = 'object'
    AND (p_value - ARRAY['traceparent', 'tracestate']) = '{}'::jsonb
    AND jsonb_typeof(p_value -> 'traceparent') = 'string'
    AND (p_value ->> 'traceparent') ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
    AND substr(p_value ->> 'traceparent', 4, 32) <> '00000000000000000000000000000000'
    AND substr(p_value ->> 'traceparent', 37, 16) <> '0000000000000000'
    AND (
        coalesce(jsonb_typeof(p_value -> 'tracestate'), 'null') = 'null'
        OR (
            jsonb_typeof(p_value -> 'tracestate') = 'string'
            AND length(p_value ->> 'tracestate') <= 512
            AND (p_value ->> 'tracestate') ~ '^[ -~]*$'
        )
    ),
    FALSE
);

COMMENT ON FUNCTION _trace_context_valid(jsonb) IS
'Whether a trace context is null or a W3C {traceparent, tracestate?} object (inlined).';

-- A trace context from p_parameter (runrelay.trace_context, or
-- items[i].trace_context): returns if _trace_context_valid, else raises
-- 22023 saying what is wrong.
CREATE FUNCTION _check_trace_context(p_parameter text, p_value jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hint constant text := 'Pass a W3C trace context: {"traceparent": "00-<32 hex trace id>-<16 hex parent id>-'
        '<2 hex flags>"}, optionally with "tracestate" (a string of at most 512 printable ASCII characters).';
    v_key text;
    v_traceparent text := p_value ->> 'traceparent';
BEGIN
    IF _trace_context_valid(p_value) THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_value) <> 'object' THEN
        PERFORM _invalid(p_parameter, format('must be a JSON object (got %s)', jsonb_typeof(p_value)), v_hint);
    END IF;
    SELECT min(k.name) INTO v_key FROM jsonb_object_keys(p_value - ARRAY['traceparent', 'tracestate']) AS k (name);
    IF v_key IS NOT NULL THEN
        PERFORM _invalid(p_parameter, format('has an unknown key %s', _quote(v_key)), v_hint);
    END IF;
    IF jsonb_typeof(p_value -> 'traceparent') IS DISTINCT FROM 'string' THEN
        PERFORM _invalid(p_parameter,
            format('needs traceparent, a string (got %s)', coalesce(jsonb_typeof(p_value -> 'traceparent'), 'none')),
            v_hint);
    END IF;
    IF v_traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
        OR substr(v_traceparent, 4, 32) = '00000000000000000000000000000000'
        OR substr(v_traceparent, 37, 16) = '0000000000000000' THEN
        PERFORM _invalid(p_parameter,
            format('traceparent %s is not a version-00 W3C traceparent with ids not all zeros', _quote(v_traceparent)),
            v_hint);
    END IF;
    PERFORM _invalid(p_parameter, 'tracestate must be a string of at most 512 printable ASCII characters', v_hint);
END;
$$;

COMMENT ON FUNCTION _check_trace_context(text, jsonb) IS
'Validates a trace context (22023 naming the parameter): null, or a W3C {traceparent, tracestate?} object.';

-- The trace context of the setting runrelay.trace_context: null when unset
-- or '', else its JSON, checked (22023 naming the setting). The callers read
-- the setting first and call this only when it is set, so an enqueue without
-- a context pays one current_setting().
CREATE FUNCTION _setting_trace_context()
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_text text := current_setting('runrelay.trace_context', TRUE);
    v_value jsonb;
BEGIN
    IF coalesce(v_text, '') = '' THEN
        RETURN NULL;
    END IF;
    BEGIN
        v_value := v_text::jsonb;
    EXCEPTION
        WHEN invalid_text_representation THEN
            PERFORM _invalid('runrelay.trace_context', format('is not JSON (%s)', SQLERRM),
                'SET LOCAL runrelay.trace_context to a JSON object {"traceparent": ..., "tracestate": ...}, or to ''''.');
    END;
    PERFORM _check_trace_context('runrelay.trace_context', v_value);
    RETURN v_value;
END;
$$;

COMMENT ON FUNCTION _setting_trace_context() IS
'The trace context of the setting runrelay.trace_context (null when unset or empty), checked.';
