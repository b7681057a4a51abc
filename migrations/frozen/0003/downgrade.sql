-- Undo revision 0003.
ALTER TABLE ledger DROP CONSTRAINT ledger_acked_locally_delivered;

ALTER TABLE ledger DROP COLUMN acked_locally;
