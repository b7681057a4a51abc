-- list_paused_queues(): the paused queues, by name, each with the reason
-- and operator pause_queue recorded and when it was paused. Reads only the
-- (small) paused_queues table; no lock.
CREATE TYPE paused_queue AS (
    queue text,
    reason text,
    paused_by text,
    paused_at timestamptz
);

CREATE FUNCTION list_paused_queues()
RETURNS SETOF paused_queue
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _require_read_committed();
    RETURN QUERY
    SELECT p.queue, p.reason, p.paused_by, p.paused_at
    FROM paused_queues AS p
    ORDER BY p.queue;
END;
$$;

COMMENT ON FUNCTION list_paused_queues() IS
'The paused queues with their reason, operator and pause time, by name.';
