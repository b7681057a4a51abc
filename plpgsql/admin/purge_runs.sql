-- purge_runs(): delete ended runs (completed, failed, cancelled) that ended
-- before a cut-off, at most max_rows per call, oldest created first, with
-- everything that belongs to them: attempts and signals (their foreign
-- keys cascade), ledger events, lanes and wake-ups (the triggers on runs,
-- schema/08_run_history.sql), call records and cancel markers. Returns the
-- number of runs deleted; call again until it answers 0.
--
-- A run whose ledger still has an undelivered event (pending, leased or
-- failed) is kept unless include_undelivered is true: its events have not
-- reached their consumer yet, and deleting the run would lose them.
-- Undelivered means a lane with a head or a wake-up (schema/06_ledger.sql).
--
-- Cost: the candidates come from runs_list_idx, one range per (queue,
-- ended status) pair up to the cut-off (a run ends after it is created, so
-- the runs that ended before it were created before it), oldest first, a
-- window of max_rows keys at a time; finished_at is in the index, so the
-- ranges are read without the heap. The entries a call skips are the runs
-- created before the cut-off that ended after it (read in the index only),
-- and, by default, the ended runs still waiting for a delivery (two probes
-- each, every call, until delivered). Each run deleted costs its rows'
-- deletion through their keys.
--
-- Locks: the candidates' rows FOR UPDATE SKIP LOCKED, in run_id COLLATE "C"
-- order (custody step 2): a run a writer holds (a retry_run in flight, a
-- relay's share lock while it refreshes a lane) is skipped, never waited
-- for. Under those locks, in a fresh snapshot, the ledger is checked again
-- (nothing can be appended to a locked run). Deleting the ledger rows takes
-- their lane rows first (custody step 4: the trigger locks every deleted
-- run's lanes in the lane order before deleting any event), waiting for a
-- relay that holds one under the bounded lock wait (10 s, or the caller's
-- tighter lock_timeout; 55P03, nothing deleted).
CREATE FUNCTION purge_runs(
    finished_before timestamptz,
    max_rows integer DEFAULT 1000,
    include_undelivered boolean DEFAULT FALSE
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- The number of (queue, status) ranges is unknown to a generic plan; its
-- guess can cross jit_above_cost (see list_runs).
SET jit = off
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_queues text[];
    v_want integer;
    v_window text[];
    v_window_end timestamptz;
    v_after_at timestamptz := '-infinity'::timestamptz;
    v_after_id text := '';
    v_candidates text[] := '{}'::text[];
    v_locked text[];
    v_purged text[];
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_time('finished_before', purge_runs.finished_before, FALSE);
    PERFORM _check_int('max_rows', purge_runs.max_rows, 1, 10000);
    IF purge_runs.include_undelivered IS NULL THEN
        PERFORM _invalid('include_undelivered', 'must not be null', 'Pass true or false.');
    END IF;

    -- The oldest ended runs first, by (created_at, run_id), a window at a
    -- time: the keys of each (queue, status) range (index-only where the
    -- visibility map allows), merged, then the ledger check of each key in
    -- the window alone. The next window starts after the last key looked
    -- at, so a run held back for its delivery is looked at once a call.
    v_queues := _listed_queues();
    LOOP
        v_want := purge_runs.max_rows - cardinality(v_candidates);
        SELECT array_agg(w.run_id ORDER BY w.created_at, w.run_id), max(w.created_at)
        INTO v_window, v_window_end
        FROM (
            SELECT p.created_at, p.run_id
            FROM generate_subscripts(v_queues, 1) AS q (i)
            CROSS JOIN (VALUES ('completed'), ('failed'), ('cancelled')) AS s (status)
            CROSS JOIN LATERAL (
                SELECT r.created_at, r.run_id
                FROM runs AS r
                WHERE
                    r.queue = v_queues[q.i]
                    AND r.status = s.status
                    AND r.status <> 'running'
                    AND (r.created_at, r.run_id) > (v_after_at, v_after_id)
                    AND r.created_at < purge_runs.finished_before
                    AND r.finished_at < purge_runs.finished_before
                ORDER BY r.created_at, r.run_id
                LIMIT v_want
            ) AS p
            ORDER BY p.created_at, p.run_id
            LIMIT v_want
        ) AS w;
        EXIT WHEN v_window IS NULL;
        v_after_at := v_window_end;
        v_after_id := v_window[cardinality(v_window)];
        v_candidates := v_candidates || ARRAY(
            SELECT k.run_id
            FROM unnest(v_window) WITH ORDINALITY AS k (run_id, ord)
            WHERE purge_runs.include_undelivered OR NOT _ledger_undelivered(k.run_id)
            ORDER BY k.ord
        );
        EXIT WHEN cardinality(v_candidates) >= purge_runs.max_rows;
    END LOOP;
    IF cardinality(v_candidates) = 0 THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 0);
    END IF;

    SELECT coalesce(array_agg(l.run_id ORDER BY l.run_id COLLATE "C"), '{}'::text[]) INTO v_locked
    FROM (
        SELECT r.run_id
        FROM runs AS r
        WHERE
            r.run_id = ANY(v_candidates)
            AND _terminal(r.status)
            AND r.finished_at < purge_runs.finished_before
        ORDER BY r.run_id COLLATE "C"
        FOR UPDATE SKIP LOCKED
    ) AS l;
    -- A fresh snapshot, under the locks: an append that committed since the
    -- candidates were read is seen.
    SELECT coalesce(array_agg(k.run_id ORDER BY k.run_id COLLATE "C"), '{}'::text[]) INTO v_purged
    FROM unnest(v_locked) AS k (run_id)
    WHERE purge_runs.include_undelivered OR NOT _ledger_undelivered(k.run_id);
    IF cardinality(v_purged) = 0 THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 0);
    END IF;

    DELETE FROM runs AS r WHERE r.run_id = ANY(v_purged);
    DELETE FROM calls AS c WHERE c.run_id = ANY(v_purged);
    DELETE FROM cancellations AS m WHERE m.run_id = ANY(v_purged);
    RETURN _restore_lock_wait(v_caller_lock_timeout, cardinality(v_purged));
END;
$$;

COMMENT ON FUNCTION purge_runs(timestamptz, integer, boolean) IS
'Deletes up to max_rows runs that ended before the cut-off, with their attempts, ledger, calls and markers; returns the count.';
