-- Revision 0004: the worker path.
-- A claim records each attempt's place in it, so that a replayed claim
-- answers in exactly the original order.
ALTER TABLE attempts ADD COLUMN claim_position integer;
