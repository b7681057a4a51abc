-- _check_run_owner(): on a shard of a sharded install, refuse run_ids that
-- the shard map gives to another shard (22023 naming the item, nothing
-- changed); on an unsharded install (shard_ownership empty) check nothing.
--
-- The one home of the ownership rule; every path that creates runs calls it
-- before its first write: enqueue_run, and _enqueue (enqueue_runs,
-- enqueue_due_schedules). One statement whatever the number of run_ids.
-- The partition is _routing_partition's, the proxy's run_hash.
-- A NULL element is not checked (callers pass NULL for the items that
-- repeat an existing run, and validate NULL run_ids themselves). No lock: the
-- row changes only when `runrelay migrate` rewrites the map.
-- _routing_partition(): the partition of a run_id in a map of
-- p_partition_count partitions, the proxy's run_hash: the first 32 bits of
-- the MD5 of the routing key (the text between the first '{' and the next
-- '}' when not empty, else the whole run_id), signed, masked by
-- p_partition_count - 1. IMMUTABLE SQL with a standard body, so the planner
-- inlines it into the set-based check below.
CREATE FUNCTION _routing_partition(p_run_id text, p_partition_count integer)
RETURNS integer
LANGUAGE sql
IMMUTABLE
RETURN ('x' || left(md5(coalesce(nullif(substring(p_run_id FROM '\{([^}]*)\}'), ''), p_run_id)), 8))::bit(32)::integer
& (p_partition_count - 1);

COMMENT ON FUNCTION _routing_partition(text, integer) IS
'The partition of a run_id (its {tag} when it has one) in a map of the given partition count, as the proxy routes it.';

CREATE FUNCTION _check_run_owner(p_run_ids text[], p_batch boolean)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_i integer;
    v_shard integer;
BEGIN
    SELECT g.i, o.shard INTO v_i, v_shard
    FROM shard_ownership AS o
    CROSS JOIN generate_subscripts(p_run_ids, 1) AS g (i)
    WHERE NOT _routing_partition(p_run_ids[g.i], o.partition_count) = ANY (o.partitions)
    ORDER BY g.i
    LIMIT 1;
    IF v_i IS NOT NULL THEN
        PERFORM _invalid(
            CASE WHEN p_batch THEN format('items[%s].run_id', v_i - 1) ELSE 'run_id' END,
            format('run_id %s belongs to another shard than shard %s', _quote(p_run_ids[v_i]), v_shard),
            'Enqueue through the proxy, or on the shard that runrelay.shard_for(run_id) names on the proxy.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_run_owner(text[], boolean) IS
'On a shard, raises 22023 for a run_id that the shard map gives to another shard; checks nothing unsharded.';

-- _check_schedule_owner(): on a shard, a schedule must create every one of
-- its runs on this shard. Its run_ids are schedule:<name>:<slot>; without a
-- {tag} in the name each slot would route by its whole run_id, so slots
-- would belong to every shard and enqueue_due_schedules here would refuse
-- them, blocking this shard's other schedules. So the name must carry a
-- non-empty {tag}, and the tag must route here. Unsharded: nothing checked.
CREATE FUNCTION _check_schedule_owner(p_name text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_owner shard_ownership;
BEGIN
    SELECT o.* INTO v_owner FROM shard_ownership AS o;
    IF v_owner.shard IS NULL THEN
        RETURN;
    END IF;
    IF nullif(substring(p_name FROM '\{([^}]*)\}'), '') IS NULL THEN
        PERFORM _invalid('name',
            format('a schedule on shard %s of a sharded install needs a {tag} in its name (got %s)',
                v_owner.shard, _quote(p_name)),
            'Its runs are schedule:<name>:<slot>: put a {tag} in the name that runrelay.shard_for names this shard for, so every slot''s run lives on this shard.');
    END IF;
    IF NOT _routing_partition(p_name, v_owner.partition_count) = ANY (v_owner.partitions) THEN
        PERFORM _invalid('name',
            format('the {tag} of schedule %s routes its runs to another shard than shard %s', _quote(p_name), v_owner.shard),
            'Declare the schedule on the shard that runrelay.shard_for(name) names on the proxy.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_schedule_owner(text) IS
'On a shard, raises 22023 unless the schedule name carries a {tag} that routes to this shard; checks nothing unsharded.';
