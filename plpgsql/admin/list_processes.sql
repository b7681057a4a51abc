-- list_processes(): the workers and relays alive, or lately alive, by
-- name, derived from what their own calls already write -- no call writes
-- anything more for it, so keeping it current costs no round trip:
--   worker  its running attempts (held: how many; last seen: their latest
--           claim or heartbeat) and the attempts it ended in the last hour
--           (their finished_at; not a lost one, which the reaper ended);
--   relay   the lanes whose lease it holds (held: how many) and its
--           acknowledgements of the last hour (ledger_deliveries, their
--           delivered_at). A lease says the relay was seen at its batch's
--           first claim and no earlier than its expiry minus the longest
--           lease (300 s): that bound counts when no acknowledgement is
--           later.
-- A name is listed when it was seen in the last hour or holds something
-- now. presumed_dead: it holds a lease that has expired (an attempt past
-- lease_expires_at that the reaper has not yet reclaimed, or a lapsed lane
-- lease nobody took over). Workers first, then relays, each by name.
--
-- Reads only, no lock: the running attempts (attempts_lease_expiry_idx), the
-- hour of ended attempts (attempts_finished_idx), the leased lanes
-- (ledger_lanes_lease_owner_idx) and the hour of acknowledgements
-- (ledger_deliveries_delivered_idx): what is held now and the last hour's
-- activity, never the history. A claim's local acknowledgement of
-- transport-only events is not counted: it is written on the events, which
-- only the whole hour's events would find, and a relay that makes one also
-- leases or delivers what follows.
-- A worker that claims nothing for an hour, holding nothing, drops out.
CREATE TYPE process AS (
    name text,
    kind text,
    last_seen_at timestamptz,
    held integer,
    presumed_dead boolean
);

CREATE FUNCTION list_processes()
RETURNS SETOF process
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz;
    v_since timestamptz;
BEGIN
    PERFORM _require_read_committed();
    v_now := _now();
    v_since := v_now - interval '1 hour';
    RETURN QUERY
    WITH seen AS (
        SELECT
            a.worker AS name,
            'worker' AS kind,
            greatest(a.claimed_at, a.heartbeat_at) AS seen_at,
            1 AS held,
            a.lease_expires_at < v_now AS expired
        FROM attempts AS a
        WHERE a.status = 'running'
        UNION ALL
        SELECT a.worker, 'worker', a.finished_at, 0, FALSE
        FROM attempts AS a
        -- A lost attempt was ended by the reaper, not by its worker.
        WHERE a.finished_at IS NOT NULL AND a.finished_at >= v_since AND a.status <> 'lost'
        UNION ALL
        SELECT
            ll.lease_owner, 'relay',
            greatest(ll.batch_started_at, ll.lease_expires_at - interval '300 seconds'), 1,
            ll.lease_expires_at < v_now
        FROM ledger_lanes AS ll
        WHERE ll.lease_owner IS NOT NULL
        UNION ALL
        SELECT d.delivered_by, 'relay', d.delivered_at, 0, FALSE
        FROM ledger_deliveries AS d
        WHERE d.delivered_at >= v_since
    )
    SELECT s.name, s.kind, max(s.seen_at), sum(s.held)::integer, bool_or(s.expired)
    FROM seen AS s
    GROUP BY s.kind, s.name
    HAVING max(s.seen_at) >= v_since OR sum(s.held) > 0
    ORDER BY s.kind DESC, s.name;
END;
$$;

COMMENT ON FUNCTION list_processes() IS
'The workers and relays seen in the last hour or holding work now: last seen, held attempts or lanes, presumed dead.';
