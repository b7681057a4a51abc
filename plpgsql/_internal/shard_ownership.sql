-- _check_run_owner(): on a shard of a sharded install, refuse run_ids that
-- the shard map gives to another shard (22023 naming the item, nothing
-- changed); on an unsharded install (shard_ownership empty) check nothing.
--
-- The one home of the ownership rule; every path that creates runs calls it
-- before its first write: enqueue_run, and _enqueue (enqueue_runs,
-- enqueue_due_schedules). One statement whatever the number of run_ids.
-- The hash is the proxy's run_hash: the first 32 bits of the MD5 of the
-- routing key (the text between the first '{' and the next '}' when not
-- empty, else the whole run_id), signed, masked by partition_count - 1.
-- A NULL element is not checked (callers pass NULL for the items that
-- repeat an existing run, and validate NULL run_ids themselves). No lock: the
-- row changes only when `runrelay migrate` rewrites the map.
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
    WHERE NOT (
        ('x' || left(md5(coalesce(nullif(substring(p_run_ids[g.i] FROM '\{([^}]*)\}'), ''), p_run_ids[g.i])), 8))::bit(32)::integer
        & (o.partition_count - 1) = ANY (o.partitions)
    )
    ORDER BY g.i
    LIMIT 1;
    IF v_i IS NOT NULL THEN
        PERFORM _invalid(
            CASE WHEN p_batch THEN format('items[%s].run_id', v_i - 1) ELSE 'run_id' END,
            format('run_id %s belongs to another shard than shard %s', quote_literal(left(p_run_ids[v_i], 200)), v_shard),
            'Enqueue through the proxy, or on the shard that runrelay.shard_for(run_id) names on the proxy.');
    END IF;
END;
$$;

COMMENT ON FUNCTION _check_run_owner(text[], boolean) IS
'On a shard, raises 22023 for a run_id that the shard map gives to another shard; checks nothing unsharded.';
