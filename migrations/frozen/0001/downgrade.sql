-- Frozen DDL undoing revision 0001.
DROP TABLE ledger_lanes;
DROP TABLE ledger;
DROP TABLE signals;
DROP TABLE cancellations;
DROP TABLE attempts;
DROP TABLE runs;
DROP SEQUENCE runs_key_position_seq;
DROP TABLE settings;
