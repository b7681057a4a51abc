-- Revision 0003: the run ledger API.
-- A local acknowledgement (a transport-only head acknowledged by a claim) is
-- told apart from a delivery, so a replayed claim can report it again.
ALTER TABLE ledger ADD COLUMN acked_locally boolean NOT NULL DEFAULT FALSE;

ALTER TABLE ledger ADD CONSTRAINT ledger_acked_locally_delivered CHECK (
    NOT acked_locally OR state = 'delivered'
);
