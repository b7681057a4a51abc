-- _claim_lane(): claim the head prefix of one run's lane for a relay.
--
-- Precondition: the caller holds the lane row lock (ledger_lanes). Every read
-- of the tail below is a fresh statement, so an append that committed while
-- the caller waited for the lock is seen. p_from, when given, is a seq no
-- undelivered event of the lane precedes (ack_ledger passes the seq after the
-- prefix it just acknowledged): the tail scan starts there.
--
-- In order:
--   * expected_head: if given and the head is another event, nothing;
--   * a failed head, a head leased to another relay (live lease) or a head
--     not yet due blocks the lane: nothing;
--   * a head in a frozen batch: exactly that batch's undelivered members are
--     (re)leased to this relay, never widened (and never past a member that
--     failed, which blocks the lane behind it);
--   * a transport-only head whose successor is claimable is acknowledged
--     locally (kind local_ack) and the next event becomes the head; without a
--     claimable successor the lane rests (dormant) until an append;
--   * otherwise the head, and with p_batch up to p_max consecutive claimable
--     successors (stopping at the first failed, not-due, foreign-leased,
--     transport-only or frozen event), are leased; with p_batch they form a
--     new frozen batch.
-- Finally the lane's availability is recomputed.
CREATE FUNCTION _claim_lane(
    p_relay text,
    p_run_id text,
    p_lane text,
    p_max integer,
    p_batch boolean,
    p_lease interval,
    p_call_id uuid,
    p_expected_head bigint,
    p_from bigint DEFAULT NULL
)
RETURNS SETOF claim_ledger_result
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := _now();
    v_head ledger;
    v_next ledger;
    v_event ledger;
    v_first boolean := TRUE;
    v_local_acks integer := 0;
    v_members bigint[] := '{}'::bigint[];
    v_batch uuid;
    v_from bigint;
BEGIN
    -- Start at the lane's known head: delivered events before it may still
    -- have (dead) entries in ledger_pending_idx until VACUUM, and the scan
    -- must not step over them (O(batch), never O(delivered history)).
    SELECT greatest(ll.head_seq, p_from, 0) INTO v_from
    FROM ledger_lanes AS ll
    WHERE ll.run_id = p_run_id AND ll.lane = p_lane;
    LOOP
        SELECT l.* INTO v_head
        FROM ledger AS l
        WHERE
            l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
            AND l.seq >= v_from
        ORDER BY l.seq
        LIMIT 1;
        EXIT WHEN v_head.event_id IS NULL;
        IF v_first AND p_expected_head IS NOT NULL AND v_head.event_id <> p_expected_head THEN
            EXIT;
        END IF;
        v_first := FALSE;
        EXIT WHEN NOT _ledger_claimable(v_head, p_relay, v_now);

        IF v_head.batch_id IS NOT NULL THEN
            RETURN QUERY
            WITH released AS (
                UPDATE ledger AS l
                SET state = 'leased',
                    lease_owner = p_relay,
                    lease_expires_at = v_now + p_lease,
                    call_id = coalesce(p_call_id, l.call_id)
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane
                    AND l.batch_id = v_head.batch_id AND l.state IN ('pending', 'leased')
                    -- Never past a member that failed: it blocks what follows.
                    AND l.seq < coalesce((
                        SELECT min(f.seq) FROM ledger AS f
                        WHERE
                            f.run_id = p_run_id AND f.lane = p_lane
                            AND f.batch_id = v_head.batch_id AND f.state = 'failed'
                    ), 9223372036854775807)
                RETURNING l.*
            )
            SELECT x.*
            FROM released AS r
            CROSS JOIN LATERAL _ledger_row('claimed', r::ledger, v_now) AS x
            ORDER BY r.seq;
            EXIT;
        END IF;

        IF v_head.transport_only THEN
            SELECT l.* INTO v_next
            FROM ledger AS l
            WHERE
                l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
                AND l.seq > v_head.seq
            ORDER BY l.seq
            LIMIT 1;
            EXIT WHEN v_next.event_id IS NULL OR v_local_acks >= 1000
                OR v_next.state = 'failed' OR NOT _ledger_claimable(v_next, p_relay, v_now);
            UPDATE ledger AS l
            SET state = 'delivered',
                delivered_at = v_now,
                delivered_by = p_relay,
                acked_locally = TRUE,
                lease_owner = NULL,
                lease_expires_at = NULL,
                call_id = p_call_id
            WHERE l.event_id = v_head.event_id
            RETURNING l.* INTO v_head;
            v_local_acks := v_local_acks + 1;
            RETURN NEXT _ledger_row('local_ack', v_head, v_now);
            v_from := v_head.seq + 1;
            CONTINUE;
        END IF;

        v_members := ARRAY[v_head.event_id];
        IF p_batch AND p_max > 1 THEN
            FOR v_event IN
                SELECT l.*
                FROM ledger AS l
                WHERE
                    l.run_id = p_run_id AND l.lane = p_lane AND l.state <> 'delivered'
                    AND l.seq > v_head.seq
                ORDER BY l.seq
                LIMIT p_max - 1
            LOOP
                EXIT WHEN v_event.transport_only OR v_event.batch_id IS NOT NULL
                    OR NOT _ledger_claimable(v_event, p_relay, v_now);
                v_members := v_members || v_event.event_id;
            END LOOP;
            v_batch := gen_random_uuid();
        END IF;
        RETURN QUERY
        WITH leased AS (
            UPDATE ledger AS l
            SET state = 'leased',
                lease_owner = p_relay,
                lease_expires_at = v_now + p_lease,
                batch_id = v_batch,
                batch_started_at = CASE WHEN v_batch IS NOT NULL THEN v_now END,
                call_id = p_call_id
            WHERE l.event_id = ANY(v_members)
            RETURNING l.*
        )
        SELECT x.*
        FROM leased AS r
        CROSS JOIN LATERAL _ledger_row('claimed', r::ledger, v_now) AS x
        ORDER BY r.seq;
        EXIT;
    END LOOP;
    PERFORM _refresh_lane(p_run_id, p_lane, v_from);
END;
$$;

COMMENT ON FUNCTION _claim_lane(text, text, text, integer, boolean, interval, uuid, bigint, bigint) IS
'Claims one run lane''s head prefix for a relay (caller holds the lane lock); see claim_ledger.';
