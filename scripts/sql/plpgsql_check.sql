-- Every function of the schema through plpgsql_check, extra warnings on:
-- any error or warning fails `make test`.
CREATE EXTENSION IF NOT EXISTS plpgsql_check;

CREATE TEMP TABLE plpgsql_findings AS
SELECT
    p.oid::regprocedure AS function_signature,
    c.lineno,
    c.level,
    c.message,
    c.detail
FROM pg_catalog.pg_proc AS p
INNER JOIN pg_catalog.pg_language AS l ON p.prolang = l.oid
-- A trigger function is checked against the table and transition table of
-- its trigger.
LEFT JOIN pg_catalog.pg_trigger AS t ON p.oid = t.tgfoid AND NOT t.tgisinternal
CROSS JOIN
    LATERAL plpgsql_check_function_tb(
        p.oid,
        relid => coalesce(t.tgrelid, 0),
        oldtable => t.tgoldtable,
        newtable => t.tgnewtable,
        extra_warnings => TRUE,
        performance_warnings => FALSE,
        security_warnings => TRUE
    ) AS c
WHERE
    p.pronamespace = 'runrelay'::regnamespace
    AND l.lanname = 'plpgsql';

SELECT
    function_signature,
    lineno,
    level,
    message,
    detail
FROM plpgsql_findings
ORDER BY 1, 2;

DO $check$
DECLARE
    v_count integer;
    v_functions integer;
BEGIN
    SELECT count(*) INTO v_count FROM plpgsql_findings;
    SELECT count(*) INTO v_functions
    FROM pg_catalog.pg_proc AS p
    WHERE p.pronamespace = 'runrelay'::regnamespace;
    IF v_count > 0 THEN
        RAISE EXCEPTION 'plpgsql_check: % finding(s)', v_count;
    END IF;
    RAISE NOTICE 'plpgsql_check: % functions, no findings', v_functions;
END
$check$;
