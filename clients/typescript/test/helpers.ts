// Test helpers: a fresh database per test file (a copy of the migrated
// template scripts/test_ts.sh prepares), and a protocol round-trip counter.

import pg from "pg";

import { Client } from "../src/index.js";

const server = process.env["RUNRELAY_TS_SERVER"];
const template = process.env["RUNRELAY_TS_TEMPLATE"];

export function urlFor(database: string): string {
  if (!server || !template) {
    throw new Error("RUNRELAY_TS_SERVER and RUNRELAY_TS_TEMPLATE are not set: run make test-ts");
  }
  const url = new URL(server);
  url.pathname = `/${database}`;
  return url.toString();
}

let counter = 0;

export interface TestDatabase {
  readonly url: string;
  readonly pool: pg.Pool;
  readonly client: Client;
  /** End the pool and drop the database. */
  close(): Promise<void>;
}

/** A new database copied from the migrated template; `pool` and `client` on
 * it. Call close() after the tests that use it. */
export async function freshDatabase(label: string): Promise<TestDatabase> {
  const name = `rr_ts_${label}_${process.pid}_${counter++}`;
  const admin = new pg.Client({ connectionString: server });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${name} TEMPLATE ${template}`);
  await admin.end();
  const url = urlFor(name);
  const pool = new pg.Pool({ connectionString: url, max: 8 });
  const close = async (): Promise<void> => {
    await pool.end();
    const drop = new pg.Client({ connectionString: server });
    await drop.connect();
    await drop.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await drop.end();
  };
  return { url, pool, client: new Client(pool), close };
}

/** Counts the round trips a connection makes: each extended-protocol Sync
 * (or simple Query) message it writes is answered by one ReadyForQuery. The
 * count comes from the bytes on the socket, not from the client's code. */
export function countRoundTrips(conn: pg.Client | pg.PoolClient): { readonly count: number } {
  const stream = (conn as unknown as { connection: { stream: NodeJS.WritableStream } }).connection
    .stream;
  const counted = { count: 0 };
  let pending = Buffer.alloc(0);
  const write = stream.write.bind(stream) as (...args: unknown[]) => boolean;
  (stream as unknown as { write: (...args: unknown[]) => boolean }).write = (...args: unknown[]) => {
    const chunk = args[0];
    if (Buffer.isBuffer(chunk)) {
      pending = Buffer.concat([pending, chunk]);
      // Frontend messages: a type byte, then a length that counts itself.
      while (pending.length >= 5) {
        const length = pending.readInt32BE(1);
        if (pending.length < 1 + length) break;
        const type = String.fromCharCode(pending[0]!);
        if (type === "S" || type === "Q") counted.count += 1;
        pending = pending.subarray(1 + length);
      }
    }
    return write(...args);
  };
  return counted;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
