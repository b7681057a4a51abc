-- Revision 0006: a transport-only head no longer rests.
-- Under 0005 a lane whose head was a transport-only event without a
-- successor had available_at NULL without being blocked (resting), and only
-- an append woke it. From 0006 such a head is acknowledged locally by the
-- next claim of its lane, so its lane is available like any other: at its
-- head's due time. Lanes that are empty (head_seq NULL) or blocked keep
-- available_at NULL.
UPDATE ledger_lanes AS ll
SET
    available_at = (
        SELECT l.next_attempt_at
        FROM ledger AS l
        WHERE
            l.run_id = ll.run_id AND l.lane = ll.lane AND l.state <> 'delivered'
            AND l.seq >= ll.head_seq
        ORDER BY l.seq
        LIMIT 1
    )
WHERE ll.available_at IS NULL AND NOT ll.blocked AND ll.head_seq IS NOT NULL;
