-- record_queue_activity(): finalize the whole minutes of queue activity
-- (runs ended completed / failed, by queue) that are at least the grace
-- period old, into queue_activity, and move the watermark past them — the
-- maintenance loop's call, every round (runrelay.maintenance: every worker's
-- built-in maintenance and `runrelay maintain` run it). Returns how many
-- minutes it finalized (0 when none was due, or another call held the
-- rollup).
--
-- The minutes: from the watermark (queue_activity_watermark.final_before),
-- or from an hour before the current minute when there is none or it is
-- older (the overview shows an hour; minutes older than that are never
-- filled in), up to the minute that holds now - 2 minutes, exclusive. All
-- of them are counted by one statement over one range of
-- ledger_created_idx (_queue_activity_between), one row per (minute, queue)
-- with activity; the watermark moves in the same transaction, so a reader
-- sees the minutes and the watermark together or neither.
--
-- The grace period, 2 minutes: an event's created_at is its writer's clock
-- when the writing statement began, and the transaction commits later: a
-- minute counted as soon as it ended would miss the events of transactions
-- still open then. The engine's writes that end runs are single short
-- statements (autocommit, or a worker's transaction around one call), so
-- two minutes leave a wide margin; a terminal event whose transaction stays
-- open longer than that after writing it is not counted in the rollup (the
-- minute is final by then).
--
-- Rows older than a day are deleted, at most 10 000 per call (a day's worth
-- for seven queues; the next calls take the rest).
--
-- Locks: one finalizer at a time, by the watermark row
-- (queue_activity_watermark) taken FOR UPDATE SKIP LOCKED, a row no login
-- but runrelay's functions can lock (docs/security.md#locks-no-other-login-can-take): a concurrent
-- caller answers 0 at once and the holder does the work, so two maintenance
-- loops never count a minute twice nor wait for each other. The very first
-- call inserts the row instead (from an hour back, where a call without one
-- starts) and holds it; a concurrent first call answers 0 without waiting
-- for that insert. Under that lock it writes only queue_activity
-- rows (new minutes: ON CONFLICT DO NOTHING also keeps a minute that is
-- already there, which only a clock set back can bring about) and the
-- watermark row; no run, event or lane is locked, and no writer of the
-- engine waits for it. A replay after a lost reply finds the minutes done
-- and answers 0 (or the minutes that came due meanwhile).
CREATE FUNCTION record_queue_activity()
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- One planned statement over a range whose size a generic plan cannot know:
-- compiling it would cost more than running it.
SET jit = off
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_grace constant interval := interval '2 minutes';
    v_now timestamptz;
    v_from timestamptz;
    v_to timestamptz;
BEGIN
    PERFORM _require_read_committed();
    -- The locking read returns the row as its last holder committed it.
    SELECT w.final_before INTO v_from FROM queue_activity_watermark AS w FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Held by another call (the insert meets the committed row, does
        -- nothing, and never waits for its lock), or no row yet: this call
        -- creates it and holds it until commit. An insert would wait for
        -- another call that is creating the row right now; the shortest
        -- lock_timeout turns that wait into the answer 0 as well (whatever
        -- the timing: had it waited, it would have met that row, or, if
        -- that call rolled back, left the minutes to the next call).
        BEGIN
            PERFORM set_config('lock_timeout', '1ms', TRUE);
            INSERT INTO queue_activity_watermark AS w (final_before, updated_at)
            VALUES (_activity_minute(_now()) - interval '1 hour', _now())
            ON CONFLICT (singleton) DO NOTHING;
            IF NOT FOUND THEN
                RETURN _restore_lock_wait(v_caller_lock_timeout, 0);
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            RETURN _restore_lock_wait(v_caller_lock_timeout, 0);
        END;
        -- The 1 ms stays until the end: nothing below waits for anyone (only
        -- the holder writes the rollup's rows).
    END IF;
    -- Read after the lock: the lock never waits, but the clock is the
    -- holder's.
    v_now := _now();
    v_to := _activity_minute(v_now - v_grace);
    v_from := greatest(v_from, _activity_minute(v_now) - interval '1 hour');
    IF v_from >= v_to THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 0);
    END IF;

    INSERT INTO queue_activity AS a (minute, queue, completed, failed)
    SELECT t.minute, t.queue, t.completed, t.failed
    FROM _queue_activity_between(v_from, v_to) AS t
    ON CONFLICT (minute, queue) DO NOTHING;

    INSERT INTO queue_activity_watermark AS w (final_before, updated_at)
    VALUES (v_to, v_now)
    ON CONFLICT (singleton) DO UPDATE SET final_before = excluded.final_before, updated_at = excluded.updated_at;

    -- Oldest first, by the primary key (minute leads).
    DELETE FROM queue_activity AS a
    WHERE (a.minute, a.queue) IN (
        SELECT o.minute, o.queue
        FROM queue_activity AS o
        WHERE o.minute < v_to - interval '1 day'
        ORDER BY o.minute, o.queue
        LIMIT 10000
    );

    RETURN _restore_lock_wait(v_caller_lock_timeout, (extract(EPOCH FROM v_to - v_from) / 60)::integer);
END;
$$;

COMMENT ON FUNCTION record_queue_activity() IS
'Finalizes the whole minutes of queue activity at least 2 minutes old into queue_activity; returns how many minutes.';
