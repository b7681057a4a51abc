-- Which runs this database may create, when it is one shard of a sharded
-- install: one row, written by `runrelay migrate` against the proxy (never by
-- a runrelay role), empty on an unsharded install.
--
-- A run is owned by the shard its routing key hashes to: partition =
-- run_hash & (partition_count - 1), where run_hash is the first 32 bits of
-- the MD5 of the routing key (the {tag} in the run_id, else the whole id), as
-- the proxy computes it. A shard that accepted any run_id would let a
-- producer connected to it directly (or a forged one-shard call) create a run
-- that the proxy routes elsewhere: the same run_id could then exist, and run,
-- on two shards. _check_run_owner refuses such a run_id before any write.
CREATE TABLE shard_ownership (
    singleton boolean PRIMARY KEY DEFAULT TRUE,
    shard integer NOT NULL,
    partition_count integer NOT NULL,
    partitions integer[] NOT NULL,
    CONSTRAINT shard_ownership_singleton CHECK (singleton),
    CONSTRAINT shard_ownership_shard CHECK (shard BETWEEN 0 AND 32767),
    CONSTRAINT shard_ownership_partition_count CHECK (
        partition_count BETWEEN 1 AND 32768
        AND partition_count & (partition_count - 1) = 0
    ),
    CONSTRAINT shard_ownership_partitions CHECK (
        cardinality(partitions) <= partition_count
    )
);
