-- Undo revision 0004.
ALTER TABLE attempts DROP COLUMN claim_position;
