-- Signals sent to runs that were not (yet) waiting for them; the next
-- matching event wait consumes the oldest one.
CREATE TABLE signals (
    signal_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    name text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT signals_name_length CHECK (length(name) BETWEEN 1 AND 200)
);

CREATE INDEX signals_run_name_idx ON signals (run_id, name, signal_id);
