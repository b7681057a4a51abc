import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import pg from "pg";

import {
  Client,
  ClientArgumentError,
  fenceOf,
  ERROR_CLASSES,
  ERROR_TABLE,
  InvalidArgument,
  PermissionDenied,
  SQL_API,
  SchemaMissing,
} from "../src/index.js";
import { countRoundTrips, freshDatabase, type TestDatabase } from "./helpers.js";

const TOKEN = "00000000-0000-0000-0000-000000000001";
const CALLS_PER_METHOD = 7;

// Arguments for every function that succeed (with some outcome) when repeated
// on a database holding run "rt".
function calls(now: Date): Record<string, object> {
  const fence = { run_id: "rt", attempt: 1, lease_token: TOKEN };
  const dayAgo = new Date(now.getTime() - 86_400_000);
  return {
    get_schema_version: {},
    enqueue_run: { run_id: "rt", payload: { k: 1 } },
    enqueue_runs: { items: [{ run_id: "rt", payload: { k: 1 } }, { run_id: "rt2" }] },
    append_events: { run_id: "rt", events: [{ type: "x", lane: "observability" }] },
    signal_run: { run_id: "missing", name: "go" },
    cancel_run: { run_id: "missing" },
    claim_attempts: { worker: "w1", queues: ["empty"] },
    heartbeat: fence,
    record_step: { ...fence, step: "step-1", result: { r: 1 } },
    complete_attempt: fence,
    complete_attempts: { items: [fence] },
    settle_and_claim: { items: [{ op: "complete", ...fence }], worker: "w1", queues: ["empty"] },
    fail_attempt: { ...fence, error: { e: 1 } },
    suspend_attempt: { ...fence, wait: { kind: "event", name: "n" } },
    release_attempt: { ...fence, reason: "shutdown" },
    prepare_waiting_failure: fence,
    record_runner_terminal: { run_id: "missing", attempt: 1, result: {} },
    claim_detached_terminal: fence,
    read_runner_terminal: { run_id: "rt", attempt: 1 },
    reap_expired: {},
    claim_ledger: { relay: "relay-1", run_id: "missing" },
    ack_ledger: { relay: "relay-1", run_id: "rt", event_ids: [1], claim_next: 1 },
    claim_ledger_runs: { relay: "relay-1", max_runs: 2 },
    ack_ledger_runs: { relay: "relay-1", event_ids: [1], claim_runs: 1 },
    renew_ledger_lease: { relay: "relay-1", event_ids: [1] },
    release_ledger: { relay: "relay-1", event_ids: [1] },
    fail_ledger: { relay: "relay-1", event_ids: [1], error: { e: 1 } },
    ledger_next_due_at: {},
    requeue_ledger_event: { event_id: 1 },
    prune: { delivered_before: dayAgo },
    list_runs: { queue: "rt-none" },
    get_run: { run_id: "rt" },
    run_attempts: { run_id: "rt" },
    run_steps: { run_id: "rt" },
    run_ledger_events: { run_id: "rt", max_rows: 5 },
    retry_run: { run_id: "missing" },
    list_blocked_heads: { run_id: "rt" },
    requeue_blocked_heads: { run_id: "missing" },
    skip_ledger_events: { run_id: "missing", lane: "lifecycle", reason: "gone" },
    list_processes: {},
    pause_queue: { queue: "rt-paused", reason: "test" },
    resume_queue: { queue: "rt-never-paused" },
    list_paused_queues: {},
    purge_runs: { finished_before: dayAgo },
    run_trace_context: { run_id: "rt" },
    upsert_schedule: { name: "rt-tick", cron: "@hourly", payload: { k: 1 } },
    delete_schedule: { name: "rt-none" },
    list_schedules: {},
    enqueue_due_schedules: {},
    schedules_next_due_at: {},
    queue_overview: {},
    ledger_overview: {},
    record_queue_activity: {},
  };
}

function camel(name: string): string {
  return name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
}

describe("the client", () => {
  let pool: pg.Pool;
  let client: Client;
  let url: string;
  let db: TestDatabase;

  before(async () => {
    db = await freshDatabase("client");
    ({ pool, client, url } = db);
  });
  after(() => db.close());

  test("every function of the SQL API is one round trip, prepared or not", async () => {
    const conn = await pool.connect();
    try {
      await client.enqueueRun({ run_id: "rt", payload: { k: 1 } }, conn);
      const table = calls(new Date());
      assert.deepEqual(Object.keys(table).sort(), Object.keys(SQL_API).sort());
      for (const [fn, args] of Object.entries(table)) {
        const method = (client as unknown as Record<string, (a: object, c: unknown) => Promise<unknown>>)[
          camel(fn)
        ];
        assert.equal(typeof method, "function", `no method for ${fn}`);
        const counter = countRoundTrips(conn);
        for (let i = 0; i < CALLS_PER_METHOD; i++) {
          const before = counter.count;
          await method!.call(client, args, conn);
          assert.equal(counter.count - before, 1, `${fn}: call ${i + 1} took ${counter.count - before} round trips`);
        }
      }
    } finally {
      conn.release();
    }
  });

  test("the SQL API table is what the migrated database says", async () => {
    // Names, types and defaults of the parameters, whether the function
    // answers rows, and its result columns, from the catalog.
    const { rows } = await pool.query<{
      proname: string;
      args: string;
      rows: boolean;
      columns: [string, string][];
    }>(
      `SELECT p.proname,
              pg_get_function_arguments(p.oid) AS args,
              p.proretset OR t.typrelid <> 0 AS rows,
              CASE WHEN t.typrelid <> 0 THEN ARRAY(
                SELECT json_build_array(a.attname, format_type(a.atttypid, NULL))
                FROM pg_attribute AS a
                WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum
              ) ELSE ARRAY(
                SELECT json_build_array(o.name, format_type(o.type, NULL))
                FROM unnest(p.proargnames, p.proargmodes, p.proallargtypes)
                  WITH ORDINALITY AS o (name, mode, type, n)
                WHERE o.mode IN ('o', 't')
                ORDER BY o.n
              ) END AS columns
       FROM pg_proc AS p
       INNER JOIN pg_type AS t ON t.oid = p.prorettype
       WHERE p.pronamespace = 'runrelay'::regnamespace AND NOT starts_with(p.proname, '_')`,
    );
    const seen = new Map(rows.map((r) => [r.proname, r]));
    assert.deepEqual([...seen.keys()].sort(), Object.keys(SQL_API).sort());
    for (const [fn, spec] of Object.entries(SQL_API)) {
      const row = seen.get(fn)!;
      const expected = spec.params
        .map(([name, type, fallback]) => (fallback === null ? `${name} ${type}` : `${name} ${type} DEFAULT ${fallback}`))
        .join(", ");
      assert.equal(row.args, expected, `${fn}: parameters`);
      assert.equal(row.rows, spec.rows, `${fn}: rows or one value`);
      assert.deepEqual(row.columns, spec.columns, `${fn}: result columns`);
    }
  });

  test("every error class of docs/errors.md exists with its SQLSTATE", () => {
    for (const row of ERROR_TABLE) {
      assert.equal(ERROR_CLASSES[row.name]?.sqlstate, row.sqlstate, row.name);
    }
  });

  test("bad input raises InvalidArgument naming the parameter, and changes nothing", async () => {
    await assert.rejects(
      client.enqueueRun({ run_id: "bad", max_attempts: 0 }),
      (error: unknown) => {
        assert.ok(error instanceof InvalidArgument);
        assert.equal(error.sqlstate, "22023");
        assert.equal(error.parameter, "max_attempts");
        return true;
      },
    );
    assert.equal(await client.getRun({ run_id: "bad" }), null);
  });

  test("arguments the call cannot take are refused before any SQL", async () => {
    const conn = await pool.connect();
    try {
      const counter = countRoundTrips(conn);
      assert.throws(() => client.bind("enqueue_run", { run_id: "x", colour: "red" }), ClientArgumentError);
      await assert.rejects(client.enqueueRun({ queue: "q" } as never, conn), ClientArgumentError);
      await assert.rejects(
        client.enqueueRun({ run_id: "x", run_at: "2026-01-01T00:00:00" }, conn),
        /must carry a UTC offset/,
      );
      assert.equal(counter.count, 0);
    } finally {
      conn.release();
    }
  });

  test("an enqueue inside the caller's transaction commits or rolls back with it", async () => {
    const conn = await pool.connect();
    try {
      await conn.query("BEGIN");
      await client.enqueueRun({ run_id: "tx-rolled-back" }, conn);
      await conn.query("ROLLBACK");
      await conn.query("BEGIN");
      await conn.query("CREATE TEMP TABLE orders (id int)");
      const made = await client.enqueueRun({ run_id: "tx-committed", payload: { order: 7 } }, conn);
      assert.deepEqual(made, { run_id: "tx-committed", status: "queued", created: true });
      assert.equal(await client.getRun({ run_id: "tx-committed" }), null, "invisible before commit");
      await conn.query("COMMIT");
    } finally {
      conn.release();
    }
    assert.equal(await client.getRun({ run_id: "tx-rolled-back" }), null);
    assert.equal((await client.getRun({ run_id: "tx-committed" }))?.status, "queued");
  });

  test("results are typed: numbers, dates, JSON, outcomes", async () => {
    await client.enqueueRun({ run_id: "typed", queue: "typed", payload: { n: [1, 2] } });
    const [claimed] = await client.claimAttempts({ worker: "w", queues: ["typed"] });
    assert.ok(claimed);
    assert.equal(claimed.run_id, "typed");
    assert.equal(claimed.attempt, 1);
    assert.deepEqual(claimed.payload, { n: [1, 2] });
    assert.ok(claimed.lease_expires_at instanceof Date);
    const appended = await client.appendEvents({ run_id: "typed", events: [{ type: "progress" }] });
    assert.equal(typeof appended[0]?.event_id, "number");
    assert.equal(typeof appended[0]?.seq, "number");
    const outcome = await client.completeAttempt({ ...fenceOf(claimed), result: { ok: true } });
    assert.equal(outcome, "completed");
  });

  test("a missing schema raises SchemaMissing; a role without the grant PermissionDenied", async () => {
    const other = new Client(pool, { schema: "not_runrelay" });
    await assert.rejects(other.getSchemaVersion(), SchemaMissing);
    const role = `rr_ts_nobody_${process.pid}`;
    await pool.query(`DROP ROLE IF EXISTS ${role}`);
    await pool.query(`CREATE ROLE ${role} LOGIN PASSWORD 'x'`);
    await pool.query(`GRANT USAGE ON SCHEMA runrelay TO ${role}`);
    const u = new URL(url);
    u.username = role;
    u.password = "x";
    const denied = new pg.Pool({ connectionString: u.toString(), max: 1 });
    try {
      await assert.rejects(new Client(denied).enqueueRun({ run_id: "denied" }), PermissionDenied);
    } finally {
      await denied.end();
      await pool.query(`DROP OWNED BY ${role}`);
      await pool.query(`DROP ROLE ${role}`);
    }
    assert.equal(await client.getRun({ run_id: "denied" }), null);
  });
});

describe("errors through a sharded install's proxy", () => {
  test("a shard's error wrapped by PL/Proxy is unwrapped: class, message, hint, parameter", async () => {
    const { translate, InvalidArgument: Invalid, ShardUnavailable } = await import("../src/index.js");
    const wrapped = Object.assign(
      new Error("runrelay.heartbeat(4): [postgres] REMOTE ERROR: runrelay: invalid lease_seconds: must be 5..300"),
      { code: "22023", hint: "Remote hint: pass 30" },
    );
    const error = translate(wrapped);
    assert.ok(error instanceof Invalid);
    assert.equal(error.parameter, "lease_seconds");
    assert.equal(error.hint, "pass 30");
    assert.match(error.message, /^runrelay: invalid lease_seconds/);
    const down = translate(Object.assign(new Error("runrelay: shard 2 is unavailable: connection refused"), { code: "08006" }));
    assert.ok(down instanceof ShardUnavailable);
    assert.equal(down.shard, 2);
    const other = Object.assign(new Error("division by zero"), { code: "22012" });
    assert.equal(translate(other), other, "an error runrelay has no class for passes through");
  });
});
