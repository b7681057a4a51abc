-- _normalize_events(): validates an events array (append_events, final_events)
-- and returns it with every default filled in, so the append routine never
-- sees a malformed element. Fenced writes validate the shape up front with
-- p_check_unused => false and check that the keys are unused only once the
-- fence has passed (_check_keys_unused): a replay of a committed call must
-- answer its recorded outcome, not "key already used". Explicit delivery keys must be unique within the
-- array and unused; keys ending in :<number> are reserved for the default
-- keys <run_id>:<seq>.
CREATE FUNCTION _normalize_events(
    p_parameter text, p_events jsonb, p_check_unused boolean DEFAULT TRUE
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_event jsonb;
    v_index integer := 0;
    v_out jsonb := '[]'::jsonb;
    v_key text;
    v_keys text[] := '{}'::text[];
    v_hint constant text :=
        'Pass an array of objects {type, payload?, lane?, delivery_key?, transport_only?}; '
        'lane is lifecycle or observability.';
BEGIN
    IF p_events = '[]'::jsonb THEN
        RETURN p_events;  -- the common case (no final_events): nothing to check
    END IF;
    PERFORM _check_json(p_parameter, p_events, 'array');
    IF jsonb_array_length(p_events) > 1000 THEN
        PERFORM _invalid(p_parameter, format('has %s events; at most 1000 per call', jsonb_array_length(p_events)), v_hint);
    END IF;
    FOR v_event IN SELECT e.value FROM jsonb_array_elements(p_events) AS e (value) LOOP
        v_index := v_index + 1;
        IF jsonb_typeof(v_event) <> 'object' THEN
            PERFORM _invalid(p_parameter, format('element %s is a JSON %s, not an object', v_index, jsonb_typeof(v_event)), v_hint);
        END IF;
        IF EXISTS (
            SELECT 1 FROM jsonb_object_keys(v_event) AS k (name)
            WHERE k.name NOT IN ('type', 'payload', 'lane', 'delivery_key', 'transport_only')
        ) THEN
            PERFORM _invalid(p_parameter, format('element %s has an unknown field', v_index), v_hint);
        END IF;
        IF jsonb_typeof(v_event -> 'type') IS DISTINCT FROM 'string' OR NOT _id_valid(v_event ->> 'type') THEN
            PERFORM _invalid(p_parameter, format(
                'element %s needs a type: a string of 1 to 200 characters, not blank, without control characters',
                v_index), v_hint);
        END IF;
        -- Producers and workers alike: only the engine writes run.* and
        -- step.* events, so a consumer can trust them.
        IF _event_type_reserved(v_event ->> 'type') THEN
            PERFORM _invalid(p_parameter, format(
                'element %s: type %s is in a namespace reserved for the engine''s events (run., step.)',
                v_index, _quote(v_event ->> 'type')),
                'Choose an event type that starts with neither run. nor step. (e.g. order.shipped).');
        END IF;
        IF v_event ? 'lane' AND (v_event ->> 'lane') IS DISTINCT FROM 'lifecycle'
            AND (v_event ->> 'lane') IS DISTINCT FROM 'observability' THEN
            PERFORM _invalid(p_parameter, format('element %s has an unknown lane %s', v_index, _quote((v_event -> 'lane')::text)), v_hint);
        END IF;
        IF v_event ? 'transport_only' AND jsonb_typeof(v_event -> 'transport_only') <> 'boolean' THEN
            PERFORM _invalid(p_parameter, format('element %s: transport_only must be a boolean', v_index), v_hint);
        END IF;
        v_key := NULL;
        IF v_event ? 'delivery_key' AND jsonb_typeof(v_event -> 'delivery_key') <> 'null' THEN
            v_key := v_event ->> 'delivery_key';
            IF jsonb_typeof(v_event -> 'delivery_key') <> 'string' OR length(v_key) NOT BETWEEN 1 AND 400 THEN
                PERFORM _invalid(p_parameter, format('element %s: delivery_key must be a string of 1 to 400 characters', v_index), v_hint);
            END IF;
            IF v_key = ANY(v_keys) THEN
                PERFORM _invalid(p_parameter, format('element %s repeats delivery_key %s', v_index, _quote(v_key)), 'Delivery keys must be unique.');
            END IF;
            -- Default keys are <run_id>:<seq>, for runs that may not exist yet:
            -- an explicit key of that form could collide with one later. (And
            -- the unique index holds explicit keys only: 06_ledger.sql.)
            IF v_key ~ ':[0-9]+$' THEN
                PERFORM _invalid(p_parameter, format('element %s: delivery_key %s ends in :<number>, the form reserved for default keys <run_id>:<seq>', v_index, _quote(v_key)),
                    'Omit delivery_key to get the default, or choose a key that does not end in a colon and digits (e.g. order-123).');
            END IF;
            IF p_check_unused AND EXISTS (
                SELECT 1 FROM ledger_events AS l
                WHERE l.delivery_key = v_key AND l.delivery_key <> l.run_id || ':' || l.seq::text
            ) THEN
                PERFORM _invalid(p_parameter, format('element %s: delivery_key %s is already used', v_index, _quote(v_key)), 'Delivery keys must be unique.');
            END IF;
            v_keys := v_keys || v_key;
        END IF;
        v_out := v_out || jsonb_build_array(jsonb_build_object(
            'type', v_event ->> 'type',
            'payload', coalesce(v_event -> 'payload', '{}'::jsonb),
            'lane', coalesce(v_event ->> 'lane', 'lifecycle'),
            'delivery_key', v_key,
            'transport_only', coalesce((v_event ->> 'transport_only')::boolean, FALSE)
        ));
    END LOOP;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION _normalize_events(text, jsonb, boolean) IS
'Validates an events array and fills in defaults (payload {}, lane lifecycle, transport_only false).';

CREATE FUNCTION _check_keys_unused(p_parameter text, p_events jsonb)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key text;
BEGIN
    SELECT l.delivery_key INTO v_key
    FROM jsonb_array_elements(p_events) AS e (value)
    INNER JOIN ledger_events AS l
        ON
            l.delivery_key = e.value ->> 'delivery_key'
            -- explicit keys only, as the index holds them (06_ledger.sql)
            AND l.delivery_key <> l.run_id || ':' || l.seq::text
    LIMIT 1;
    IF v_key IS NOT NULL THEN
        PERFORM _invalid(p_parameter, format('delivery_key %s is already used', _quote(v_key)),
            'Delivery keys must be unique.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_keys_unused(text, jsonb) IS
'Raises 22023 if an explicit delivery key of normalised events is already used.';
