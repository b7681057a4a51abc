-- Batches that name several runs or events: each shard gets its own part in
-- one call, and the answers are put back in the caller's order. A batch that
-- spans shards is not atomic across them (each shard commits its part);
-- every part replays exactly (fences, call_id, idempotent run_ids), so the
-- answer to a shard that is down is to repeat the whole call.
--
-- A call that reaches one shard handles that shard being down with a line
-- install.py expands (@skip_if_down(...)@, @unavailable_if_down(...)@ or
-- @if_shard_down@ and what follows it): that handler is written once.

-- The shard (by its lowest partition) that owns a run.
CREATE FUNCTION @proxy@.run_head(p_run_id text)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT @proxy@.shard_partition(p.shard)
    FROM @config@.partitions AS p
    WHERE p.partition = @proxy@.run_hash(p_run_id) & (@proxy@.partition_count() - 1);
$$;

-- A batch's items by shard, each with the positions (1-based) they had.
-- Anything but a non-empty array of objects goes whole to the shard of
-- partition 0, which rejects it with its own error.
CREATE FUNCTION @proxy@.item_groups(p_items jsonb)
RETURNS TABLE (head integer, items jsonb, ords integer[])
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array'
        OR jsonb_array_length(p_items) = 0
        OR jsonb_path_exists(p_items, '$[*] ? (@.type() != "object")') THEN
        RETURN QUERY SELECT @proxy@.shard_partition(p.shard), p_items, '{}'::integer []
            FROM @config@.partitions AS p WHERE p.partition = 0;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT g.head, jsonb_agg(g.item ORDER BY g.ord), array_agg(g.ord::integer ORDER BY g.ord)
        FROM (
            SELECT @proxy@.run_head(e.item ->> 'run_id') AS head, e.item, e.ord
            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e (item, ord)
        ) AS g
        GROUP BY g.head
        ORDER BY g.head;
END;
$$;

-- Event ids by shard (event_id >> 48). Ids of no configured shard, and an
-- array the shard must reject (NULL, empty, NULL members), go to the shard
-- of partition 0, which answers for them as it does for unknown ids.
CREATE FUNCTION @proxy@.event_groups(p_event_ids bigint[])
RETURNS TABLE (head integer, ids bigint[])
LANGUAGE sql
STABLE
AS $$
    SELECT
        coalesce(@proxy@.shard_partition(@proxy@.event_shard(e.id)), @proxy@.shard_partition(z.shard)),
        array_agg(e.id ORDER BY e.ord)
    FROM unnest(coalesce(p_event_ids, '{NULL}'::bigint [])) WITH ORDINALITY AS e (id, ord)
    CROSS JOIN (SELECT p.shard FROM @config@.partitions AS p WHERE p.partition = 0) AS z
    WHERE p_event_ids IS NOT NULL AND cardinality(p_event_ids) > 0 AND array_position(p_event_ids, NULL) IS NULL
    GROUP BY 1
    UNION ALL
    SELECT @proxy@.shard_partition(p.shard), p_event_ids
    FROM @config@.partitions AS p
    WHERE p.partition = 0
        AND (p_event_ids IS NULL OR cardinality(p_event_ids) = 0 OR array_position(p_event_ids, NULL) IS NOT NULL);
$$;

-- The answer comes in run_id COLLATE "C" order, as a shard gives it (its
-- lock order), not grouped by shard.
CREATE FUNCTION @schema@.complete_attempts(@args:complete_attempts@)
RETURNS @result:complete_attempts@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
    v_rows @schema@.complete_attempts_result [] := ARRAY[]::@schema@.complete_attempts_result [];
BEGIN
    FOR v_group IN SELECT * FROM @proxy@.item_groups(complete_attempts.items) LOOP
        BEGIN
            v_rows := v_rows || ARRAY(
                SELECT r FROM @proxy@.on_complete_attempts(v_group.head, v_group.items) AS r
            );
        @unavailable_if_down(v_group.head)@
        END;
    END LOOP;
    RETURN QUERY
        SELECT u.run_id, u.attempt, u.outcome
        FROM unnest(v_rows) WITH ORDINALITY AS u
        ORDER BY u.run_id COLLATE "C", u.ordinality;
END;
$$;

CREATE FUNCTION @schema@.enqueue_runs(@args:enqueue_runs@)
RETURNS @result:enqueue_runs@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
    v_rows @schema@.enqueue_runs_result [];
    v_out @schema@.enqueue_runs_result [] := ARRAY[]::@schema@.enqueue_runs_result [];
BEGIN
    IF jsonb_typeof(enqueue_runs.items) = 'array' THEN
        PERFORM @proxy@.keyed_hash(e.item ->> 'run_id', e.item ->> 'concurrency_key')
        FROM jsonb_array_elements(enqueue_runs.items) AS e (item)
        WHERE jsonb_typeof(e.item) = 'object';
    END IF;
    FOR v_group IN SELECT * FROM @proxy@.item_groups(enqueue_runs.items) LOOP
        BEGIN
            SELECT coalesce(array_agg(r), '{}') INTO v_rows
            FROM @proxy@.on_enqueue_runs(v_group.head, v_group.items) AS r;
        @unavailable_if_down(v_group.head)@
        END;
        FOR v_i IN 1 .. cardinality(v_rows) LOOP
            v_out[v_group.ords[v_i]] := v_rows[v_i];
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_out);
END;
$$;

-- Settle each shard's items there, and claim from the shards in the walk
-- order of the call_id, each shard asked for what is still missing. The
-- shards that hold items are visited first: when one of them is down the
-- call fails before any other shard claimed a run for it (a claim commits on
-- its shard at once, and would wait for the replay after the outage). The
-- settled rows come back in item order, then the claimed rows.
CREATE FUNCTION @schema@.settle_and_claim(@args:settle_and_claim@)
RETURNS @result:settle_and_claim@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_left integer := settle_and_claim.max_runs;
    v_part integer;
    v_items jsonb;
    v_ords integer [];
    v_rows @schema@.settle_and_claim_result [];
    v_settled @schema@.settle_and_claim_result [] := ARRAY[]::@schema@.settle_and_claim_result [];
    v_claimed @schema@.settle_and_claim_result [] := ARRAY[]::@schema@.settle_and_claim_result [];
    v_row @schema@.settle_and_claim_result;
    v_k integer;
    v_routed integer := 0;
    v_total integer;
BEGIN
    IF jsonb_typeof(settle_and_claim.items) IS DISTINCT FROM 'array'
        OR jsonb_path_exists(settle_and_claim.items, '$[*] ? (@.type() != "object")')
        OR v_left IS NULL OR v_left NOT BETWEEN 0 AND 1000 THEN
        -- Malformed: the shard of partition 0 rejects it with its own error.
        RETURN QUERY SELECT * FROM @proxy@.on_settle_and_claim(
            0, settle_and_claim.items, settle_and_claim.worker, settle_and_claim.queues,
            settle_and_claim.max_runs, settle_and_claim.lease_seconds, settle_and_claim.call_id,
            settle_and_claim.tasks
        );
        RETURN;
    END IF;
    v_total := jsonb_array_length(settle_and_claim.items);
    FOR v_part IN
        SELECT w.head
        FROM @proxy@.walk(settle_and_claim.call_id) WITH ORDINALITY AS w (head, n)
        ORDER BY
            w.head IN (
                SELECT g.head FROM @proxy@.item_groups(settle_and_claim.items) AS g
                WHERE v_total > 0
            ) DESC,
            w.n
    LOOP
        SELECT coalesce(g.items, '[]'), coalesce(g.ords, '{}') INTO v_items, v_ords
        FROM (SELECT 1) AS one
        LEFT JOIN @proxy@.item_groups(settle_and_claim.items) AS g
            ON g.head = v_part AND v_total > 0;
        CONTINUE WHEN cardinality(v_ords) = 0 AND v_left = 0;
        BEGIN
            SELECT coalesce(array_agg(r), '{}') INTO v_rows
            FROM @proxy@.on_settle_and_claim(
                v_part, v_items, settle_and_claim.worker, settle_and_claim.queues,
                v_left, settle_and_claim.lease_seconds, settle_and_claim.call_id, settle_and_claim.tasks
            ) AS r;
        @if_shard_down@
            IF cardinality(v_ords) > 0 THEN
                PERFORM @proxy@.shard_unavailable(v_part, SQLERRM);
            END IF;
            PERFORM @proxy@.skip_shard(v_part, SQLERRM);
            CONTINUE;
        END;
        v_k := 0;
        FOREACH v_row IN ARRAY v_rows LOOP
            IF v_row.kind = 'settled' THEN
                v_k := v_k + 1;
                v_settled[v_ords[v_k]] := v_row;
            ELSE
                v_claimed := v_claimed || v_row;
                v_left := v_left - 1;
            END IF;
        END LOOP;
        v_routed := v_routed + cardinality(v_ords);
    END LOOP;
    IF v_routed < v_total THEN
        -- Items of a shard that has no partition: cannot happen with a valid
        -- map; say so rather than drop them.
        RAISE EXCEPTION 'runrelay: % of % items could not be routed', v_total - v_routed, v_total
            USING ERRCODE = 'internal_error';
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_settled) UNION ALL SELECT * FROM unnest(v_claimed);
END;
$$;

CREATE FUNCTION @schema@.renew_ledger_lease(@args:renew_ledger_lease@)
RETURNS @result:renew_ledger_lease@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
BEGIN
    FOR v_group IN SELECT * FROM @proxy@.event_groups(renew_ledger_lease.event_ids) LOOP
        BEGIN
            RETURN QUERY SELECT * FROM @proxy@.on_renew_ledger_lease(
                v_group.head, renew_ledger_lease.relay, v_group.ids, renew_ledger_lease.lease_seconds
            );
        @unavailable_if_down(v_group.head)@
        END;
    END LOOP;
END;
$$;

CREATE FUNCTION @schema@.release_ledger(@args:release_ledger@)
RETURNS @result:release_ledger@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
    v_total integer := 0;
BEGIN
    FOR v_group IN SELECT * FROM @proxy@.event_groups(release_ledger.event_ids) LOOP
        BEGIN
            v_total := v_total
                + @proxy@.on_release_ledger(v_group.head, release_ledger.relay, v_group.ids);
        @unavailable_if_down(v_group.head)@
        END;
    END LOOP;
    RETURN v_total;
END;
$$;

-- Each shard acknowledges its own runs' events (event_groups), claiming
-- nothing; then the next runs' batches are claimed across the shards as
-- claim_ledger_runs claims them (the same call_id replays each shard's part).
CREATE FUNCTION @schema@.ack_ledger_runs(@args:ack_ledger_runs@)
RETURNS @result:ack_ledger_runs@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
BEGIN
    IF ack_ledger_runs.claim_runs IS NULL OR ack_ledger_runs.claim_runs NOT BETWEEN 0 AND 1000 THEN
        -- Refused by a shard, with the error every shard gives (it claims
        -- nothing with such a claim_runs).
        RETURN QUERY SELECT * FROM @proxy@.on_ack_ledger_runs(
            @proxy@.shard_partition((SELECT p.shard FROM @config@.partitions AS p WHERE p.partition = 0)),
            ack_ledger_runs.relay, '{}', ack_ledger_runs.claim_runs, ack_ledger_runs.max_events,
            ack_ledger_runs.lease_seconds, ack_ledger_runs.lane, ack_ledger_runs.call_id
        );
        RETURN;
    END IF;
    FOR v_group IN SELECT * FROM @proxy@.event_groups(ack_ledger_runs.event_ids) LOOP
        BEGIN
            RETURN QUERY SELECT * FROM @proxy@.on_ack_ledger_runs(
                v_group.head, ack_ledger_runs.relay, v_group.ids, 0, ack_ledger_runs.max_events,
                ack_ledger_runs.lease_seconds, ack_ledger_runs.lane, NULL
            );
        @unavailable_if_down(v_group.head)@
        END;
    END LOOP;
    IF ack_ledger_runs.claim_runs > 0 THEN
        RETURN QUERY SELECT c.*, NULL::bigint FROM @schema@.claim_ledger_runs(
            ack_ledger_runs.relay, ack_ledger_runs.lane, ack_ledger_runs.claim_runs,
            ack_ledger_runs.max_events, ack_ledger_runs.lease_seconds, ack_ledger_runs.call_id
        ) AS c;
    END IF;
END;
$$;

CREATE FUNCTION @schema@.fail_ledger(@args:fail_ledger@)
RETURNS @result:fail_ledger@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group record;
BEGIN
    FOR v_group IN SELECT * FROM @proxy@.event_groups(fail_ledger.event_ids) LOOP
        BEGIN
            RETURN QUERY SELECT * FROM @proxy@.on_fail_ledger(
                v_group.head, fail_ledger.relay, v_group.ids, fail_ledger.error,
                fail_ledger.retry_at, fail_ledger.permanent
            );
        @unavailable_if_down(v_group.head)@
        END;
    END LOOP;
END;
$$;

CREATE FUNCTION @schema@.requeue_ledger_event(@args:requeue_ledger_event@)
RETURNS @result:requeue_ledger_event@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_head integer := (
        SELECT g.head FROM @proxy@.event_groups(ARRAY[requeue_ledger_event.event_id]) AS g
    );
BEGIN
    RETURN @proxy@.on_requeue_ledger_event(v_head, requeue_ledger_event.event_id);
@if_shard_down@
    PERFORM @proxy@.shard_unavailable(v_head, SQLERRM);
    RETURN NULL;
END;
$$;
