-- pause_queue(): claims stop taking runs of a queue until resume_queue.
--
-- Outcomes: paused (the queue was not paused), already_paused (it was: its
-- reason, operator and time are kept). Nothing else about the queue's runs
-- changes: they stay queued, keep their places, and may still be enqueued,
-- cancelled, signalled, woken (a woken run is only queued) and retried;
-- running attempts go on and settle as usual. A queue is a name: one
-- with no run yet can be paused too.
--
-- Effect: a claim whose statement starts after this commits takes no run
-- of the queue (its look at paused_queues takes a fresh snapshot); a claim
-- already under way may still take one. A claim over every queue then
-- reads one index probe per queue with runnable runs and claims as a claim
-- naming the unpaused ones does (_unpaused_queues), so its cost grows with
-- the number of queues, never with a backlog, the paused one's included.
--
-- Locks: the queue's paused_queues row (insert); a concurrent pause of the
-- same queue waits for this one under the bounded lock wait (10 s, or the
-- caller's tighter lock_timeout). No run or claim is waited for. A repeat
-- is safe: already_paused.
CREATE FUNCTION pause_queue(
    queue text,
    reason text DEFAULT NULL,
    requested_by text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_caller_lock_timeout text := _bound_lock_wait();
    v_paused text;
BEGIN
    PERFORM _require_read_committed();
    PERFORM _check_id('queue', pause_queue.queue);
    PERFORM _check_reason('reason', pause_queue.reason);
    PERFORM _check_id('requested_by', pause_queue.requested_by, TRUE);
    INSERT INTO paused_queues AS p (queue, reason, paused_by, paused_at)
    VALUES (pause_queue.queue, pause_queue.reason, pause_queue.requested_by, _now())
    ON CONFLICT ON CONSTRAINT paused_queues_pkey DO NOTHING
    RETURNING p.queue INTO v_paused;
    RETURN _restore_lock_wait(v_caller_lock_timeout,
        CASE WHEN v_paused IS NULL THEN 'already_paused' ELSE 'paused' END);
END;
$$;

COMMENT ON FUNCTION pause_queue(text, text, text) IS
'Stops claims from taking runs of a queue until resume_queue: paused or already_paused.';
