-- Loaded once into the pgTAP database after `alembic upgrade head`: the pgTAP
-- extension and the `tests` schema of fixtures that the numbered files share.
CREATE EXTENSION IF NOT EXISTS pgtap;

CREATE SCHEMA tests;

UPDATE runrelay.settings SET allow_clock_override = TRUE;

-- A bare run row, for constraint tests that must not go through the API.
CREATE FUNCTION tests.insert_run(p_run_id text, p_status text DEFAULT 'queued')
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO runrelay.runs (
        run_id, queue, status, payload, run_at, max_attempts, created_at, updated_at
    )
    VALUES (p_run_id, 'default', p_status, '{}', now(), 3, now(), now());
$$;

-- A second session (dblink), for the few outcomes that only a lock held by
-- someone else produces (cancel_run's cancel_requested). Advisory locks need
-- no committed data, so the test transaction still rolls everything back.
CREATE EXTENSION IF NOT EXISTS dblink;

-- What a fenced write presents: (run_id, attempt, lease_token).
CREATE TYPE tests.claim AS (
    run_id text,
    attempt integer,
    lease_token uuid
);

-- Claim the next attempt of a run from its own queue (tests give every run
-- a queue of its own). Raises when the run is not claimable, so a fixture
-- that silently claimed nothing cannot make an assertion pass.
CREATE FUNCTION tests.claim_run(p_run_id text, p_worker text DEFAULT 'w1')
RETURNS tests.claim
LANGUAGE plpgsql
AS $$
DECLARE
    v_claim tests.claim;
BEGIN
    SELECT c.run_id, c.attempt, c.lease_token INTO v_claim
    FROM runrelay.claim_attempts(
        worker => p_worker,
        queues => ARRAY[(SELECT r.queue FROM runrelay.runs AS r WHERE r.run_id = p_run_id)]
    ) AS c;
    IF v_claim.run_id IS DISTINCT FROM p_run_id THEN
        RAISE EXCEPTION 'tests.claim_run: run % was not claimed (got %)', p_run_id, v_claim.run_id;
    END IF;
    RETURN v_claim;
END;
$$;

-- Enqueue a run on a queue named after it, and claim its first attempt.
CREATE FUNCTION tests.start_run(
    p_run_id text,
    p_max_attempts integer DEFAULT 3,
    p_concurrency_key text DEFAULT NULL,
    p_payload jsonb DEFAULT '{}'
)
RETURNS tests.claim
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM runrelay.enqueue_run(
        run_id => p_run_id,
        queue => p_run_id,
        payload => p_payload,
        max_attempts => p_max_attempts,
        concurrency_key => p_concurrency_key
    );
    RETURN tests.claim_run(p_run_id);
END;
$$;

-- Start a run and suspend its first attempt on p_wait; raises unless the
-- outcome is waiting.
CREATE FUNCTION tests.start_waiting(p_run_id text, p_wait jsonb, p_max_attempts integer DEFAULT 3)
RETURNS tests.claim
LANGUAGE plpgsql
AS $$
DECLARE
    v_claim tests.claim := tests.start_run(p_run_id, p_max_attempts);
    v_outcome text;
BEGIN
    v_outcome := runrelay.suspend_attempt(v_claim.run_id, v_claim.attempt, v_claim.lease_token, p_wait);
    IF v_outcome IS DISTINCT FROM 'waiting' THEN
        RAISE EXCEPTION 'tests.start_waiting: % answered %', p_run_id, v_outcome;
    END IF;
    RETURN v_claim;
END;
$$;

-- The lease token of an attempt.
CREATE FUNCTION tests.token(p_run_id text, p_attempt integer DEFAULT 1)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT a.lease_token FROM runrelay.attempts AS a
    WHERE a.run_id = p_run_id AND a.attempt = p_attempt;
$$;

-- A run's lifecycle event types in seq order.
CREATE FUNCTION tests.lifecycle(p_run_id text)
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT coalesce(array_agg(l.type ORDER BY l.seq), '{}'::text [])
    FROM runrelay.ledger AS l
    WHERE l.run_id = p_run_id AND l.lane = 'lifecycle';
$$;

-- Every ledger event of a run, both lanes: a replay must not change it.
CREATE FUNCTION tests.event_count(p_run_id text)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT count(*) FROM runrelay.ledger AS l WHERE l.run_id = p_run_id;
$$;

-- The run's status and its attempts' statuses, e.g. 'running:running,completed'.
CREATE FUNCTION tests.state(p_run_id text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT r.status || ':' || coalesce((
        SELECT string_agg(a.status, ',' ORDER BY a.attempt)
        FROM runrelay.attempts AS a WHERE a.run_id = r.run_id
    ), '')
    FROM runrelay.runs AS r
    WHERE r.run_id = p_run_id;
$$;

-- Move runrelay._now() by p_offset from the real clock, for the rest of the
-- transaction (settings.allow_clock_override is on in the pgTAP database).
CREATE FUNCTION tests.set_clock(p_offset interval)
RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('runrelay.clock_offset', p_offset::text, TRUE);
$$;

-- The state cancel_run leaves when it answers cancel_requested: a marker that
-- no writer has applied yet.
CREATE FUNCTION tests.mark_cancel(p_run_id text, p_reason text DEFAULT 'test')
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO runrelay.cancellations (run_id, reason, requested_at)
    VALUES (p_run_id, p_reason, now());
$$;

-- Give an existing run a concurrency key without this transaction taking the
-- key's lock (enqueue_run would hold it until the test ends, and a second
-- session could then never take it).
CREATE FUNCTION tests.set_key(p_run_id text, p_key text)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE runrelay.runs
    SET concurrency_key = p_key, key_position = nextval('runrelay.runs_key_position_seq')
    WHERE run_id = p_run_id;
$$;

-- Hold a concurrency key's lock (its concurrency_keys row) from a second
-- session, as a writer in custody of a keyed run would; tests.release_key()
-- ends that session. The holder commits the key's row first (a row this
-- transaction inserted would be invisible to it) and deletes it again on
-- release. Raises instead of waiting when the key is busy (e.g. locked by
-- this transaction), so a test cannot hang.
CREATE FUNCTION tests.hold_key(p_key text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM dblink_connect('tests_holder', format(
        'dbname=%s port=%s host=%s user=%s',
        current_database(),
        current_setting('port'),
        coalesce(host(inet_server_addr()), split_part(current_setting('unix_socket_directories'), ',', 1)),
        current_user
    ));
    BEGIN
        PERFORM dblink_exec('tests_holder', $q$SET lock_timeout = '1s'$q$);
        PERFORM dblink_exec('tests_holder', format(
            'INSERT INTO runrelay.concurrency_keys (key) VALUES (%L) ON CONFLICT DO NOTHING', p_key));
        PERFORM dblink_exec('tests_holder', 'BEGIN');
        PERFORM * FROM dblink('tests_holder', format(
            $q$SELECT set_config('tests.held_key', %L, FALSE) FROM runrelay.concurrency_keys WHERE key = %L FOR UPDATE NOWAIT$q$,
            p_key, p_key)) AS t (held text);
    EXCEPTION WHEN OTHERS THEN
        PERFORM dblink_disconnect('tests_holder');
        RAISE EXCEPTION 'tests.hold_key: key % is busy (%)', p_key, sqlerrm;
    END;
END;
$$;

-- Releases the key and deletes the row the holder made for it, so the test
-- transaction goes on as if no one had held it.
CREATE FUNCTION tests.release_key()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM dblink_exec('tests_holder',
        $q$DELETE FROM runrelay.concurrency_keys WHERE key = current_setting('tests.held_key')$q$);
    PERFORM dblink_exec('tests_holder', 'COMMIT');
    PERFORM dblink_disconnect('tests_holder');
END;
$$;

-- Whether p_expires is a lease of p_seconds granted during the current
-- statement: leases run from the moment they are granted (the locks held),
-- between the statement's start and now, on the (possibly shifted) test clock.
CREATE FUNCTION tests.granted(p_expires timestamptz, p_seconds integer)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_offset interval := coalesce(nullif(current_setting('runrelay.clock_offset', TRUE), ''), '0')::interval;
    v_lease interval := make_interval(secs => p_seconds);
BEGIN
    RETURN p_expires BETWEEN statement_timestamp() + v_offset + v_lease AND clock_timestamp() + v_offset + v_lease;
END;
$$;

-- Everything a call could write, as one digest: equal before and after a
-- call means the call wrote nothing (no row, no timestamp).
CREATE FUNCTION tests.everything()
RETURNS text
LANGUAGE sql
AS $$
    SELECT md5(concat_ws(
        '|',
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.runs AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.attempts AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.cancellations AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.signals AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.ledger AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.ledger_lanes AS t),
        (SELECT string_agg(t::text, ',' ORDER BY t::text) FROM runrelay.calls AS t)
    ));
$$;

-- tests.everything() now, kept under p_label for the rest of the transaction
-- (a setting, so that it needs no table); tests.seen(p_label) reads it back,
-- and raises for a label that this session never remembered.
CREATE FUNCTION tests.remember(p_label text)
RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('tests.seen_' || p_label, tests.everything(), TRUE);
$$;

CREATE FUNCTION tests.seen(p_label text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT current_setting('tests.seen_' || p_label);
$$;

-- Whether a function's own settings pin its search_path.
CREATE FUNCTION tests.pins_search_path(p_function oid)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_proc AS p CROSS JOIN LATERAL unnest(p.proconfig) AS c (setting)
        WHERE p.oid = p_function AND c.setting LIKE 'search_path=%'
    );
$$;

-- The roles besides its owner that a function's ACL grants EXECUTE, by name.
CREATE FUNCTION tests.execute_grantees(p_function oid)
RETURNS text[]
LANGUAGE sql
AS $$
    SELECT array(
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_proc AS p CROSS JOIN LATERAL aclexplode(p.proacl) AS a
        WHERE p.oid = p_function AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        ORDER BY a.grantee::regrole::text
    );
$$;

-- After calls with bad input that all targeted the first attempt of the run
-- p_run_id: the run and the attempt are still running, untouched, and no
-- event was emitted since the run started. Two assertions.
CREATE FUNCTION tests.still_running(p_run_id text)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN NEXT results_eq(
        format(
            'SELECT r.status, r.result, r.error, r.wait, a.status, a.runner_result, a.error
             FROM runrelay.runs AS r INNER JOIN runrelay.attempts AS a USING (run_id) WHERE r.run_id = %L',
            p_run_id
        ),
        $q$VALUES ('running', NULL::jsonb, NULL::jsonb, NULL::jsonb, 'running', NULL::jsonb, NULL::jsonb)$q$,
        'the run every rejected write targeted is still running, untouched'
    );
    RETURN NEXT is(tests.lifecycle(p_run_id), ARRAY['run.queued', 'run.started'], 'no rejected call emitted an event');
END;
$$;

-- A run put back in its queue until a minute from now (a retry, a release):
-- run_at stays there, the queue has nothing to claim before it, and after it
-- the next claim starts attempt 2. One assertion each, described by p_run_at,
-- p_not_before and p_after. The clock is moved two minutes on for the claim,
-- then back.
CREATE FUNCTION tests.queued_for_a_minute(p_run_id text, p_run_at text, p_not_before text, p_after text)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    v_claim text := format('runrelay.claim_attempts(worker => %L, queues => ARRAY[%L])', 'w1', p_run_id);
BEGIN
    RETURN NEXT is(
        (SELECT r.run_at FROM runrelay.runs AS r WHERE r.run_id = p_run_id), now() + interval '1 minute', p_run_at
    );
    RETURN NEXT is_empty('SELECT * FROM ' || v_claim, p_not_before);
    PERFORM tests.set_clock('2 minutes');
    RETURN NEXT results_eq('SELECT run_id, attempt FROM ' || v_claim, format('VALUES (%L, 2)', p_run_id), p_after);
    PERFORM tests.set_clock('0');
END;
$$;
