-- Privileges: executed after every function of a revision is (re)created.
--
-- EXECUTE is revoked from PUBLIC on every function of the schema (a per-schema
-- ALTER DEFAULT PRIVILEGES cannot revoke the global PUBLIC default, so each
-- install revokes explicitly), then each public function is granted to the
-- role of its SPEC section. Roles are named <schema>_<role> so that two
-- installs in one database stay independent. No role gets any table privilege.
DO $grants$
DECLARE
    v_schema text := current_schema();
    v_fn record;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure AS signature
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = v_schema::regnamespace
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn.signature);
    END LOOP;

    FOR v_fn IN
        SELECT
            p.oid::regprocedure AS signature,
            v_schema || '_' || g.role_suffix AS grantee
        FROM (
            VALUES
            ('get_schema_version', 'producer'),
            ('get_schema_version', 'worker'),
            ('get_schema_version', 'relay'),
            ('get_schema_version', 'admin'),
            ('enqueue_run', 'producer'),
            ('enqueue_runs', 'producer'),
            ('append_events', 'producer'),
            ('signal_run', 'producer'),
            ('cancel_run', 'producer'),
            ('claim_attempts', 'worker'),
            ('settle_and_claim', 'worker'),
            ('heartbeat', 'worker'),
            ('record_step', 'worker'),
            ('complete_attempt', 'worker'),
            ('complete_attempts', 'worker'),
            ('fail_attempt', 'worker'),
            ('suspend_attempt', 'worker'),
            ('release_attempt', 'worker'),
            ('prepare_waiting_failure', 'worker'),
            ('record_runner_terminal', 'worker'),
            ('claim_detached_terminal', 'worker'),
            ('read_runner_terminal', 'worker'),
            ('reap_expired', 'worker'),
            ('run_trace_context', 'worker'),
            ('run_trace_context', 'relay'),
            ('claim_ledger', 'relay'),
            ('ack_ledger', 'relay'),
            ('claim_ledger_runs', 'relay'),
            ('ack_ledger_runs', 'relay'),
            ('renew_ledger_lease', 'relay'),
            ('release_ledger', 'relay'),
            ('fail_ledger', 'relay'),
            ('ledger_next_due_at', 'relay'),
            ('requeue_ledger_event', 'admin'),
            ('prune', 'admin'),
            ('list_runs', 'admin'),
            ('get_run', 'admin'),
            ('run_attempts', 'admin'),
            ('run_steps', 'admin'),
            ('run_ledger_events', 'admin'),
            ('retry_run', 'admin'),
            ('list_blocked_heads', 'admin'),
            ('requeue_blocked_heads', 'admin'),
            ('skip_ledger_events', 'admin'),
            ('list_processes', 'admin'),
            ('pause_queue', 'admin'),
            ('resume_queue', 'admin'),
            ('list_paused_queues', 'admin'),
            ('purge_runs', 'admin'),
            ('upsert_schedule', 'admin'),
            ('delete_schedule', 'admin'),
            ('list_schedules', 'admin'),
            ('enqueue_due_schedules', 'worker'),
            ('enqueue_due_schedules', 'admin'),
            ('schedules_next_due_at', 'worker'),
            ('schedules_next_due_at', 'admin'),
            ('queue_overview', 'admin'),
            ('ledger_overview', 'admin'),
            ('record_queue_activity', 'worker'),
            ('record_queue_activity', 'admin')
        ) AS g (function_name, role_suffix)
        INNER JOIN pg_catalog.pg_proc AS p
            ON
                p.proname = g.function_name
                AND p.pronamespace = v_schema::regnamespace
    LOOP
        EXECUTE format(
            'GRANT EXECUTE ON FUNCTION %s TO %I', v_fn.signature, v_fn.grantee
        );
    END LOOP;

    FOR v_fn IN
        SELECT
            c.oid::regclass AS view_name,
            v_schema || '_admin' AS grantee
        FROM pg_catalog.pg_class AS c
        WHERE
            c.relnamespace = v_schema::regnamespace
            AND c.relkind = 'v'
            AND c.relname IN ('run_stats', 'ledger_stats', 'wait_stats')
    LOOP
        EXECUTE format('GRANT SELECT ON %s TO %I', v_fn.view_name, v_fn.grantee);
    END LOOP;
END
$grants$;
