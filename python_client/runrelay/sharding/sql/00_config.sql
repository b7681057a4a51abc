-- The proxy's configuration: the physical shards, and which shard holds each
-- logical partition. It lives in its own schema, which reinstalling the
-- proxy's functions never drops. PL/Proxy reads it through the three
-- plproxy.get_cluster_* functions below; every change to either table bumps
-- config_version, and PL/Proxy reloads the cluster on its next call, so a
-- shard's DSN can change (a failover, a move) without touching any client.
CREATE SCHEMA IF NOT EXISTS @config@;

CREATE TABLE IF NOT EXISTS @config@.shards (
    shard integer PRIMARY KEY CHECK (shard BETWEEN 0 AND 32767),
    dsn text NOT NULL CHECK (dsn <> '')
);

-- partition = run_hash(run_id) & (partition count - 1); the count is a power
-- of two (PL/Proxy's rule) and never changes once runs exist: a run never
-- moves.
CREATE TABLE IF NOT EXISTS @config@.partitions (
    partition integer PRIMARY KEY CHECK (partition >= 0),
    shard integer NOT NULL REFERENCES @config@.shards (shard)
);

CREATE TABLE IF NOT EXISTS @config@.settings (
    only_row boolean PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    config_version integer NOT NULL DEFAULT 1,
    revision text
);

INSERT INTO @config@.settings (only_row) VALUES (TRUE) ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION @config@.bump_config_version()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE @config@.settings AS s SET config_version = s.config_version + 1;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER shards_changed
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @config@.shards
FOR EACH STATEMENT EXECUTE FUNCTION @config@.bump_config_version();

CREATE OR REPLACE TRIGGER partitions_changed
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @config@.partitions
FOR EACH STATEMENT EXECUTE FUNCTION @config@.bump_config_version();

-- PL/Proxy's configuration API (one proxy install per database).
CREATE SCHEMA IF NOT EXISTS plproxy;

CREATE OR REPLACE FUNCTION plproxy.get_cluster_version(cluster_name text)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT s.config_version FROM @config@.settings AS s;
$$;

-- Each DSN names the session's login as its user: PL/Proxy connects to the
-- shards as that login, so every shard checks the caller's own grants. The
-- proxy's public functions are SECURITY DEFINER (so that no caller needs, or
-- has, the one-shard on_* calls and routing helpers behind them); inside
-- them current_user is their owner, whom PL/Proxy would otherwise connect
-- as (its default_user setting cannot help: PL/Proxy picks the user before
-- it first reads the cluster's configuration). The session user is fixed
-- for a backend's life, as PL/Proxy's cached copy of this list is. The
-- stored DSNs carry no user (runrelay migrate strips it); a password comes
-- from the proxy server's .pgpass or a certificate, never from here.
CREATE OR REPLACE FUNCTION plproxy.get_cluster_partitions(cluster_name text)
RETURNS SETOF text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.dsn || ' user=''' || replace(replace(session_user::text, '\', '\\'), '''', '\''') || ''''
    FROM @config@.partitions AS p
    INNER JOIN @config@.shards AS s ON s.shard = p.shard
    ORDER BY p.partition;
$$;

-- PL/Proxy calls these as the proxy functions' owner; no caller needs them.
REVOKE ALL ON FUNCTION plproxy.get_cluster_version(text) FROM public;
REVOKE ALL ON FUNCTION plproxy.get_cluster_partitions(text) FROM public;

-- connection_lifetime: reconnect now and then, so a moved shard's old address
-- is not used forever by a long-lived proxy backend.
CREATE OR REPLACE FUNCTION plproxy.get_cluster_config(
    IN cluster_name text, OUT key text, OUT val text
)
RETURNS SETOF record
LANGUAGE sql
STABLE
AS $$
    VALUES ('connection_lifetime'::text, '1800'::text);
$$;

REVOKE ALL ON FUNCTION plproxy.get_cluster_config(text) FROM public;
