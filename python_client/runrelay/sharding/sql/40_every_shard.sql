-- Calls about the whole install: asked of every shard.
--
-- A call that reaches one shard handles that shard being down with a line
-- install.py expands (@skip_if_down(...)@, @unavailable_if_down(...)@ or
-- @if_shard_down@ and what follows it): that handler is written once.

-- The revision every shard is at. Shards at different revisions (a migration
-- that stopped half way) are an error, not an answer: runrelay migrate
-- through the proxy brings them level. A shard that is down is skipped.
CREATE FUNCTION @schema@.get_schema_version(@args:get_schema_version@)
RETURNS @result:get_schema_version@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_version text;
    v_seen text;
    v_report text := '';
    v_mixed boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_version := @proxy@.on_get_schema_version(v_part);
        @skip_if_down(v_part, v_error)@
        END;
        v_mixed := v_mixed OR (v_seen IS NOT NULL AND v_seen IS DISTINCT FROM v_version);
        v_seen := v_version;
        v_report := v_report || format(' shard %s at %s;',
            (SELECT p.shard FROM @config@.partitions AS p WHERE p.partition = v_part), v_version);
    END LOOP;
    IF v_seen IS NULL THEN
        PERFORM @proxy@.no_shard_answered('get_schema_version', v_error);
    END IF;
    IF v_mixed OR v_seen IS DISTINCT FROM (SELECT s.revision FROM @config@.settings AS s) THEN
        RAISE EXCEPTION 'runrelay: the shards and the proxy are at different revisions:% proxy at %',
            v_report, (SELECT s.revision FROM @config@.settings AS s)
            USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Run runrelay migrate against the proxy: it migrates every shard and the proxy.';
    END IF;
    RETURN v_seen;
END;
$$;

-- prune and purge_runs: each shard deletes up to what is still allowed, in
-- one walk for both (p_function names which of the two each shard runs).
CREATE FUNCTION @proxy@.delete_within_budget(
    p_function text, p_before timestamptz, p_max_rows integer, p_include_undelivered boolean
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_left integer := p_max_rows;
    v_n integer;
    v_answered boolean := false;
    v_error text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_n := CASE p_function
                WHEN 'prune' THEN @proxy@.on_prune(v_part, p_before, v_left)
                ELSE @proxy@.on_purge_runs(v_part, p_before, v_left, p_include_undelivered)
            END;
        @skip_if_down(v_part, v_error)@
        END;
        v_answered := true;
        v_left := v_left - v_n;
        EXIT WHEN v_left <= 0;
    END LOOP;
    IF NOT v_answered THEN
        PERFORM @proxy@.no_shard_answered(p_function, v_error);
    END IF;
    RETURN p_max_rows - v_left;
END;
$$;

CREATE FUNCTION @schema@.prune(@args:prune@)
RETURNS @result:prune@
LANGUAGE sql
VOLATILE
AS $$
SELECT @proxy@.delete_within_budget('prune', prune.delivered_before, prune.max_rows, NULL);
$$;

CREATE FUNCTION @schema@.purge_runs(@args:purge_runs@)
RETURNS @result:purge_runs@
LANGUAGE sql
VOLATILE
AS $$
SELECT @proxy@.delete_within_budget(
    'purge_runs', purge_runs.finished_before, purge_runs.max_rows, purge_runs.include_undelivered
);
$$;

-- Pausing and resuming a queue must reach every shard: a shard that is down
-- fails the call (repeat it; both are idempotent). The answer is the change
-- if any shard changed, else what the shards said.
CREATE FUNCTION @schema@.pause_queue(@args:pause_queue@)
RETURNS @result:pause_queue@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_outcome text;
    v_answer text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_outcome := @proxy@.on_pause_queue(
                v_part, pause_queue.queue, pause_queue.reason, pause_queue.requested_by
            );
        @unavailable_if_down(v_part)@
        END;
        IF v_answer IS NULL OR v_answer LIKE 'already%' THEN
            v_answer := v_outcome;
        END IF;
    END LOOP;
    RETURN v_answer;
END;
$$;

CREATE FUNCTION @schema@.resume_queue(@args:resume_queue@)
RETURNS @result:resume_queue@
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_outcome text;
    v_answer text;
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            v_outcome := @proxy@.on_resume_queue(v_part, resume_queue.queue);
        @unavailable_if_down(v_part)@
        END;
        IF v_answer IS NULL OR v_answer NOT IN ('resumed') THEN
            v_answer := v_outcome;
        END IF;
    END LOOP;
    RETURN v_answer;
END;
$$;

-- Schedules are not available through the proxy (a schedule's runs would be
-- created on the schedule's shard whatever their run_id's partition): the
-- maintenance loop finds nothing due here, and upsert_schedule says why.
CREATE FUNCTION @schema@.schedules_next_due_at(@args:schedules_next_due_at@)
RETURNS @result:schedules_next_due_at@
LANGUAGE sql
STABLE
AS $$
    SELECT NULL::@schema@.schedules_next_due WHERE false;
$$;

CREATE FUNCTION @schema@.enqueue_due_schedules(@args:enqueue_due_schedules@)
RETURNS @result:enqueue_due_schedules@
LANGUAGE sql
STABLE
AS $$
    SELECT NULL::@schema@.enqueue_due_schedules_result WHERE false;
$$;

-- The stats views: every shard's rows that answer, summed. Each reads its
-- gather_ function (install.py writes one per view, beside the view's row
-- type and its one-shard on_ function), which leaves a shard that is down
-- out, with a WARNING.
CREATE VIEW @schema@.run_stats AS
SELECT
    s.queue,
    s.status,
    sum(s.runs)::bigint AS runs,
    sum(s.held_by_key)::bigint AS held_by_key,
    min(s.oldest_run_at) AS oldest_run_at,
    max(s.oldest_runnable_age_seconds) AS oldest_runnable_age_seconds
FROM @proxy@.gather_run_stats() AS s
GROUP BY s.queue, s.status;

CREATE VIEW @schema@.ledger_stats AS
SELECT
    s.lane,
    s.state,
    sum(s.events)::bigint AS events,
    max(s.oldest_pending_age_seconds) AS oldest_pending_age_seconds,
    sum(s.blocked_heads)::bigint AS blocked_heads,
    max(s.oldest_deliverable_age_seconds) AS oldest_deliverable_age_seconds,
    max(s.oldest_blocked_age_seconds) AS oldest_blocked_age_seconds
FROM @proxy@.gather_ledger_stats() AS s
GROUP BY s.lane, s.state;
