-- Discovery across shards: the calls that name no run walk the shards, from
-- a rotating start (proxy.walk), until their budget is filled. Every shard
-- that has work is visited before a call comes back short, so no due run or
-- event is missed; each shard is asked only for what is still missing, so
-- nothing is over-claimed. A shard that does not answer is skipped with a
-- WARNING; the call fails (08006) only when no shard answered. A shard's own
-- error (bad input, lock timeout) is raised as it is.
--
-- Rows are gathered per shard into an array before being returned, so that a
-- shard that fails mid-call adds no row. Each row carries its run_id, which is
-- all the follow-up calls need to route.
--
-- A call that reaches one shard handles that shard being down with a line
-- install.py expands (@skip_if_down(...)@, @unavailable_if_down(...)@ or
-- @if_shard_down@ and what follows it): that handler is written once.

CREATE FUNCTION @schema@.claim_attempts(@args:claim_attempts@)
RETURNS @result:claim_attempts@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_left integer := claim_attempts.max_runs;
    v_part integer;
    v_rows @schema@.claim_attempts_result[];
    v_answered boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(claim_attempts.call_id) AS w (head) LOOP
        BEGIN
            SELECT coalesce(array_agg(c), '{}') INTO v_rows
            FROM @proxy@.on_claim_attempts(
                v_part, claim_attempts.worker, claim_attempts.queues, v_left,
                claim_attempts.lease_seconds, claim_attempts.call_id, claim_attempts.tasks
            ) AS c;
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        RETURN QUERY SELECT * FROM unnest(v_rows);
        v_left := v_left - cardinality(v_rows);
        EXIT WHEN v_left <= 0;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('claim_attempts', v_error);
    END IF;
END;
$$;

-- Without run_id: the first shard that yields a claim (one run's prefix)
-- ends the walk. With run_id: that run's shard only.
CREATE FUNCTION @schema@.claim_ledger(@args:claim_ledger@)
RETURNS @result:claim_ledger@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_rows @schema@.claim_ledger_result[];
    v_answered boolean := false;
    v_error text;
BEGIN
    IF claim_ledger.run_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM @proxy@.on_claim_ledger(
            @proxy@.run_hash(claim_ledger.run_id) & (@proxy@.partition_count() - 1),
            claim_ledger.relay, claim_ledger.lane, claim_ledger.run_id,
            claim_ledger.max_events, claim_ledger.lease_seconds, claim_ledger.wait_for_run,
            claim_ledger.expected_head, claim_ledger.batch, claim_ledger.call_id
        );
        RETURN;
    END IF;
    FOR v_part IN SELECT w.head FROM @proxy@.walk(claim_ledger.call_id) AS w (head) LOOP
        BEGIN
            SELECT coalesce(array_agg(c), '{}') INTO v_rows
            FROM @proxy@.on_claim_ledger(
                v_part, claim_ledger.relay, claim_ledger.lane, NULL,
                claim_ledger.max_events, claim_ledger.lease_seconds, claim_ledger.wait_for_run,
                claim_ledger.expected_head, claim_ledger.batch, claim_ledger.call_id
            ) AS c;
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        IF cardinality(v_rows) > 0 THEN
            RETURN QUERY SELECT * FROM unnest(v_rows);
            RETURN;
        END IF;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('claim_ledger', v_error);
    END IF;
END;
$$;

-- Up to max_runs runs' lanes: each shard is asked for the runs still
-- missing, as claim_attempts asks for attempts. The rows come in run_id and
-- seq order, as one install answers them.
CREATE FUNCTION @schema@.claim_ledger_runs(@args:claim_ledger_runs@)
RETURNS @result:claim_ledger_runs@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_left integer := claim_ledger_runs.max_runs;
    v_part integer;
    v_rows @schema@.claim_ledger_result[];
    v_all @schema@.claim_ledger_result[] := ARRAY[]::@schema@.claim_ledger_result[];
    v_answered boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(claim_ledger_runs.call_id) AS w (head) LOOP
        BEGIN
            SELECT coalesce(array_agg(c), '{}') INTO v_rows
            FROM @proxy@.on_claim_ledger_runs(
                v_part, claim_ledger_runs.relay, claim_ledger_runs.lane, v_left,
                claim_ledger_runs.max_events, claim_ledger_runs.lease_seconds, claim_ledger_runs.call_id
            ) AS c;
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        v_all := v_all || v_rows;
        v_left := v_left - (SELECT count(DISTINCT r.run_id)::integer FROM unnest(v_rows) AS r);
        EXIT WHEN v_left <= 0;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('claim_ledger_runs', v_error);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_all) AS r ORDER BY r.run_id, r.seq;
END;
$$;

CREATE FUNCTION @schema@.reap_expired(@args:reap_expired@)
RETURNS @result:reap_expired@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_left integer := reap_expired.max_attempts;
    v_part integer;
    v_rows @schema@.reap_expired_result[];
    v_answered boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            SELECT coalesce(array_agg(r), '{}') INTO v_rows
            FROM @proxy@.on_reap_expired(v_part, v_left) AS r;
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        RETURN QUERY SELECT * FROM unnest(v_rows);
        v_left := v_left - cardinality(v_rows);
        EXIT WHEN v_left <= 0;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('reap_expired', v_error);
    END IF;
END;
$$;

-- The earliest due moment over every shard that answers (a shard that is
-- down cannot be claimed from anyway; the relay polls it again later).
CREATE FUNCTION @schema@.ledger_next_due_at(@args:ledger_next_due_at@)
RETURNS @result:ledger_next_due_at@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_due timestamptz;
    v_min timestamptz;
    v_answered boolean := false;
    v_error text;
BEGIN
    IF ledger_next_due_at.run_id IS NOT NULL THEN
        RETURN @proxy@.on_ledger_next_due_at(
            @proxy@.run_hash(ledger_next_due_at.run_id) & (@proxy@.partition_count() - 1),
            ledger_next_due_at.lane, ledger_next_due_at.run_id
        );
    END IF;
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_due := @proxy@.on_ledger_next_due_at(v_part, ledger_next_due_at.lane, NULL);
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        v_min := least(v_min, v_due);
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('ledger_next_due_at', v_error);
    END IF;
    RETURN v_min;
END;
$$;

-- Every shard rolls up its own activity; the answer is the sum.
CREATE FUNCTION @schema@.record_queue_activity(@args:record_queue_activity@)
RETURNS @result:record_queue_activity@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_total integer := 0;
    v_answered boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_total := v_total + @proxy@.on_record_queue_activity(v_part);
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered('record_queue_activity', v_error);
    END IF;
    RETURN v_total;
END;
$$;
