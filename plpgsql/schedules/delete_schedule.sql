-- delete_schedule(): stop a schedule for good.
--
-- Outcomes: deleted, not_found. Runs the schedule already enqueued are
-- runs like any other and stay; no slot is enqueued after this commits. A
-- schedule declared again under the same name starts at its first slot
-- after that declaration.
--
-- Locks: the schedule's row (a delete), waiting under the bounded lock wait
-- (10 s, or the caller's tighter lock_timeout) for an enqueue_due_schedules
-- that holds it. A repeat is safe: not_found.
CREATE FUNCTION delete_schedule(name text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_deleted text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('name', delete_schedule.name);
    DELETE FROM schedules AS s
    WHERE s.name = delete_schedule.name
    RETURNING s.name INTO v_deleted;
    RETURN _restore_lock_wait(v_caller_lock_timeout,
        CASE WHEN v_deleted IS NULL THEN 'not_found' ELSE 'deleted' END);
END;
$$;

COMMENT ON FUNCTION delete_schedule(text) IS
'Deletes a schedule (runs it enqueued stay): deleted or not_found.';
