-- A run's ledger rows go with the run. The ledger tables keep no foreign key
-- to runs (06_ledger.sql says why), so these triggers do what their
-- ON DELETE CASCADE did: a statement that deletes runs deletes their events,
-- lanes and wake-ups, and TRUNCATE runs empties those tables too. attempts
-- and signals keep their foreign keys and cascade as before. runrelay itself
-- never deletes runs; these are for the operator who does.
--
-- Statement-level, so deleting many runs costs three set-based deletes,
-- each an index seek per run (ledger_lane_seq_idx and the lanes' and
-- wake-ups' primary keys). No role of the install may delete or truncate
-- runs (grants.sql), so only the tables' owner does, and the triggers run
-- as that owner. Part of the schema, not of the code each revision
-- reinstalls (migrations/support.py keeps the functions a trigger calls).
CREATE FUNCTION _runs_deleted()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM ledger_events AS l WHERE l.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    DELETE FROM ledger_lanes AS ll WHERE ll.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    DELETE FROM ledger_wakeups AS w WHERE w.run_id IN (SELECT d.run_id FROM deleted_runs AS d);
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION _runs_deleted() IS
'Trigger: deletes the ledger events, lanes and wake-ups of deleted runs (the cascade of the ledger tables).';

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
