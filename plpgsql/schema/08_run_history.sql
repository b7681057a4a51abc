-- A run's ledger rows go with the run. The ledger tables keep no foreign key
-- to runs (06_ledger.sql says why), so these triggers do what their
-- ON DELETE CASCADE did: a statement that deletes runs deletes their events,
-- deliveries, lanes and wake-ups, and TRUNCATE runs empties those tables too. attempts
-- and signals keep their foreign keys and cascade as before. The engine
-- never deletes runs; these are for purge_runs and for an operator who
-- deletes runs by hand.
--
-- Statement-level, so deleting many runs costs four set-based deletes,
-- each an index seek per run (ledger_lane_seq_idx and the deliveries',
-- lanes' and wake-ups' primary keys). No role of the install may delete or truncate
-- runs (grants.sql), so only the tables' owner does, and the triggers run
-- as that owner. Part of the schema, not of the code each revision
-- reinstalls (migrations/support.py keeps the functions a trigger calls).
-- enable_seqscan is off, as in the ledger functions: with statistics taken
-- while ledger_events was small, the per-run look-ups below were planned as
-- sequential scans of the whole table.
CREATE FUNCTION _runs_deleted()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
DECLARE
    v_tids tid[];
BEGIN
    -- The deleted runs' lanes are locked first, in the lane order of
    -- custody.sql (run_id COLLATE "C", lane), waiting for a relay that holds
    -- one. A relay takes a lane, then its events: deleting the events first
    -- would hold them while waiting for the lane, and a relay writing them
    -- under that lane (an ack) would close a cycle (40P01). Found by run_id
    -- (the primary key's prefix), not ctid: a lane the relay updated before
    -- letting go is re-checked in its new version, which a ctid misses.
    PERFORM 1 FROM ledger_lanes AS ll
    WHERE ll.run_id = ANY(ARRAY(SELECT d.run_id FROM deleted_runs AS d))
    ORDER BY ll.run_id COLLATE "C", ll.lane
    FOR UPDATE OF ll;
    -- Then each table in two steps: the deleted runs' rows found by their
    -- key, a probe per run (OFFSET 0 keeps the lateral subquery a probe:
    -- flattened into a join, a plan made without statistics read the whole
    -- table), then deleted by ctid. Each step reads the ctids afresh, after
    -- the lane locks: a lane a relay updated while the purge waited for it
    -- has a new row version, which a ctid read before the wait would miss.
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_events AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_events AS l WHERE l.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_deliveries AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_deliveries AS l WHERE l.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_lanes AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_lanes AS ll WHERE ll.ctid = ANY(v_tids);
    v_tids := ARRAY(
        SELECT t.tid FROM deleted_runs AS d
        CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM ledger_wakeups AS x WHERE x.run_id = d.run_id OFFSET 0) AS t
    );
    DELETE FROM ledger_wakeups AS w WHERE w.ctid = ANY(v_tids);
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _runs_deleted() IS
'Trigger: deletes the ledger events, deliveries, lanes and wake-ups of deleted runs (the cascade of the ledger tables).';

CREATE TRIGGER runs_deleted
AFTER DELETE ON runs
REFERENCING OLD TABLE AS deleted_runs
FOR EACH STATEMENT
EXECUTE FUNCTION _runs_deleted();

CREATE FUNCTION _runs_truncated()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- A table truncated by the same statement is empty, and still open:
    -- truncating it again would fail (55006), so only a non-empty one is.
    IF EXISTS (SELECT FROM ledger_events) THEN
        TRUNCATE ledger_events;
    END IF;
    IF EXISTS (SELECT FROM ledger_deliveries) THEN
        TRUNCATE ledger_deliveries;
    END IF;
    IF EXISTS (SELECT FROM ledger_lanes) THEN
        TRUNCATE ledger_lanes;
    END IF;
    IF EXISTS (SELECT FROM ledger_wakeups) THEN
        TRUNCATE ledger_wakeups;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _runs_truncated() IS
'Trigger: empties the ledger tables when runs is truncated (the cascade of the ledger tables).';

CREATE TRIGGER runs_truncated
AFTER TRUNCATE ON runs
FOR EACH STATEMENT
EXECUTE FUNCTION _runs_truncated();
