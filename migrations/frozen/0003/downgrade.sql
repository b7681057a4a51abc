-- Undo revision 0003.
ALTER TABLE ledger DROP CONSTRAINT ledger_acked_locally_delivered;

ALTER TABLE ledger DROP COLUMN acked_locally;

ALTER TABLE ledger_lanes RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor);

ALTER TABLE ledger RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor
);

ALTER TABLE attempts RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor);

ALTER TABLE runs RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor);
