-- Undo revision 0007: 0006 has no check on attempts.outcome. Every row stays
-- valid for 0006's code (it writes the same outcomes).
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome;
