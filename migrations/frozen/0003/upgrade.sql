-- Revision 0003: the run ledger API.
-- A local acknowledgement (a transport-only head acknowledged by a claim) is
-- told apart from a delivery, so a replayed claim can report it again.
ALTER TABLE ledger ADD COLUMN acked_locally boolean NOT NULL DEFAULT FALSE;

ALTER TABLE ledger ADD CONSTRAINT ledger_acked_locally_delivered CHECK (
    NOT acked_locally OR state = 'delivered'
);

-- Queue and ledger rows churn: vacuum and analyze them well before the
-- default 20 % of dead rows, so partial-index scans over live work stay short.
ALTER TABLE runs SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02
);

ALTER TABLE attempts SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02
);

ALTER TABLE ledger SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);

ALTER TABLE ledger_lanes SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02
);
