-- Routing: which partition, and so which shard, owns a run.
--
-- The routing key of a run_id is the text between its first '{' and the next
-- '}' when that is not empty (a hash tag, as in Redis Cluster), else the
-- whole run_id. Runs that must share a shard (every run of a concurrency key)
-- carry the same tag. run_hash is the first 32 bits of the MD5 of the routing
-- key, signed: stable across PostgreSQL versions and computable in any
-- language (runrelay.sharding.run_hash is the Python twin). A NULL run_id
-- routes to partition 0, whose shard rejects it with its own error.
CREATE FUNCTION @proxy@.routing_key(run_id text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(nullif(substring(run_id FROM '\{([^}]*)\}'), ''), run_id);
$$;

CREATE FUNCTION @proxy@.run_hash(run_id text)
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(
        ('x' || substr(md5(@proxy@.routing_key(run_id)), 1, 8))::bit(32)::integer, 0
    );
$$;

-- A run with a concurrency_key must live on its key's shard, or the key's
-- runs would be serialised per shard, not as one: enqueue_run and
-- enqueue_runs through the proxy require the key as the run_id's routing key
-- (its hash tag), and route by it.
CREATE FUNCTION @proxy@.keyed_hash(run_id text, concurrency_key text)
RETURNS integer
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF keyed_hash.concurrency_key IS NOT NULL AND keyed_hash.run_id IS NOT NULL
        AND @proxy@.routing_key(keyed_hash.run_id) IS DISTINCT FROM keyed_hash.concurrency_key THEN
        RAISE EXCEPTION 'runrelay: invalid run_id: a run with a concurrency_key must carry the key as its hash tag on a sharded install (got run_id %, concurrency_key %)',
            left(keyed_hash.run_id, 200), left(keyed_hash.concurrency_key, 200)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'run_id',
            HINT = format('Put the key between braces in the run_id, e.g. %L.',
                left(keyed_hash.run_id, 100) || '{' || left(keyed_hash.concurrency_key, 100) || '}');
    END IF;
    RETURN @proxy@.run_hash(keyed_hash.run_id);
END;
$$;

CREATE FUNCTION @proxy@.partition_count()
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT count(*)::integer FROM @config@.partitions;
$$;

-- The lowest partition of each shard stands for the shard: RUN ON that
-- partition reaches it.
CREATE FUNCTION @proxy@.shard_partition(p_shard integer)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT min(p.partition) FROM @config@.partitions AS p WHERE p.shard = p_shard;
$$;

-- Ledger event ids carry their shard: each shard's event_id sequence is
-- confined to [shard << 48, (shard + 1) << 48) when the proxy is installed,
-- so calls that name events but no run (renew_ledger_lease, release_ledger,
-- fail_ledger, requeue_ledger_event) route exactly.
CREATE FUNCTION @proxy@.event_shard(p_event_id bigint)
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT (p_event_id >> 48)::integer;
$$;

-- The shards a discovery call visits, one partition per shard, in a rotating
-- order: random without a call_id; with one, an order drawn from the call_id,
-- so that a repeated call visits the shards in the order the first did and
-- each shard replays its own part exactly.
CREATE FUNCTION @proxy@.walk(p_call_id uuid)
RETURNS SETOF integer
LANGUAGE sql
VOLATILE
AS $$
    WITH heads AS (
        SELECT
            p.shard,
            min(p.partition) AS head,
            (row_number() OVER (ORDER BY p.shard) - 1)::integer AS i,
            count(*) OVER ()::integer AS n
        FROM @config@.partitions AS p
        GROUP BY p.shard
    ),

    start AS (
        SELECT CASE
            WHEN p_call_id IS NULL THEN floor(random() * 32768)::integer
            ELSE @proxy@.run_hash(p_call_id::text) & 32767
        END AS s
    )

    SELECT h.head
    FROM heads AS h CROSS JOIN start AS st
    ORDER BY (h.i + st.s) % h.n;
$$;

-- A shard that did not answer: PL/Proxy raises internal_error (XX000) for a
-- connection it could not open or lost; a shard's own error comes back with
-- "REMOTE ERROR" in its message and its own SQLSTATE.
CREATE FUNCTION @proxy@.is_shard_down(p_sqlstate text, p_message text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT p_sqlstate = 'XX000' AND p_message NOT LIKE '%REMOTE ERROR:%';
$$;

-- A discovery call skips a shard that did not answer and says so in a
-- WARNING; when no shard answered it raises connection_failure (08006).
CREATE FUNCTION @proxy@.skip_shard(p_partition integer, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE WARNING 'runrelay: shard % is unavailable and was skipped: %',
        (SELECT p.shard FROM @config@.partitions AS p WHERE p.partition = p_partition),
        p_message;
END;
$$;

CREATE FUNCTION @proxy@.no_shard_answered(p_function text, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'runrelay: % reached no shard: %', p_function, p_message
        USING ERRCODE = 'connection_failure',
        HINT = 'Every shard of runrelay.shard_map() is unavailable.';
END;
$$;

-- A call that must reach one shard that is down.
CREATE FUNCTION @proxy@.shard_unavailable(p_partition integer, p_message text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'runrelay: shard % is unavailable: %',
        (SELECT p.shard FROM @config@.partitions AS p WHERE p.partition = p_partition),
        p_message
        USING ERRCODE = 'connection_failure',
        HINT = 'Repeat the call when the shard is back; replays are exact.';
END;
$$;

-- Public: the shard that owns a run, and the map producers use to open a
-- transaction on that shard.
CREATE FUNCTION @schema@.shard_for(run_id text)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT p.shard
    FROM @config@.partitions AS p
    WHERE p.partition = @proxy@.run_hash(run_id) & (@proxy@.partition_count() - 1);
$$;

COMMENT ON FUNCTION @schema@.shard_for(text) IS
'The shard that owns run_id (by its routing key: the {tag} in it, else the whole id).';

CREATE TYPE @schema@.shard_map_row AS (
    partition integer,
    shard integer,
    dsn text
);

CREATE FUNCTION @schema@.shard_map()
RETURNS SETOF @schema@.shard_map_row
LANGUAGE sql
STABLE
AS $$
    SELECT p.partition, p.shard, s.dsn
    FROM @config@.partitions AS p
    INNER JOIN @config@.shards AS s ON s.shard = p.shard
    ORDER BY p.partition;
$$;

COMMENT ON FUNCTION @schema@.shard_map() IS
'Every logical partition with its shard and the shard''s connection string.';
