-- resume_queue(): claims take runs of a paused queue again.
--
-- Outcomes: resumed (the queue was paused; workers listening on
-- runrelay_runs are woken with the queue's name), not_paused (it was not:
-- nothing changed). Claims whose statement starts after this commits see
-- the queue again.
--
-- Locks: the queue's paused_queues row (delete), waiting for a concurrent
-- pause or resume of the same queue under the bounded lock wait (10 s, or
-- the caller's tighter lock_timeout). A repeat is safe: not_paused.
CREATE FUNCTION resume_queue(queue text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_resumed text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('queue', resume_queue.queue);
    DELETE FROM paused_queues AS p
    WHERE p.queue = resume_queue.queue
    RETURNING p.queue INTO v_resumed;
    IF v_resumed IS NULL THEN
        RETURN _restore_lock_wait(v_caller_lock_timeout, 'not_paused');
    END IF;
    PERFORM pg_notify(n.channel, resume_queue.queue) FROM _notifying('runs') AS n (channel);
    RETURN _restore_lock_wait(v_caller_lock_timeout, 'resumed');
END;
$$;

COMMENT ON FUNCTION resume_queue(text) IS
'Lets claims take runs of a paused queue again: resumed or not_paused.';
