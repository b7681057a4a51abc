// Test helpers: a fresh database per test file (a copy of the migrated
// template scripts/test_ts.sh prepares), and a protocol round-trip counter.

import net from "node:net";

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
    // pool.end() resolves once its clients are asked to end, not once their
    // sessions are gone: a session still closing when DROP ... WITH (FORCE)
    // terminates it errors in its client after the tests ended. Wait for
    // them to leave (a few seconds at most) before forcing the rest.
    const deadline = performance.now() + 5000;
    while (performance.now() < deadline) {
      const left = await drop.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1", [name]);
      if (left.rows[0].n === 0) break;
      await sleep(20);
    }
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

/** Poll `probe` until it answers something truthy; fail after `ms`. */
export async function waitFor<T>(what: string, probe: () => Promise<T | undefined | null | false>, ms = 15_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/** A TCP proxy in front of the server that can lose a reply after the
 * server committed: armed with a piece of SQL text, it swallows the reply
 * (up to and including its ReadyForQuery) to the next execution of a
 * statement whose text contains it, and closes that connection. The client
 * sees a lost connection for a call that did happen. */
export class LosingProxy {
  readonly #server: net.Server;
  #armed: string | undefined;
  cuts = 0;

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async start(target: string): Promise<{ proxy: LosingProxy; url: string }> {
    const upstream = new URL(target);
    const server = net.createServer();
    const proxy = new LosingProxy(server);
    server.on("connection", (client) => proxy.#pipe(client, upstream));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = new URL(target);
    url.hostname = "127.0.0.1";
    url.port = String((server.address() as net.AddressInfo).port);
    url.searchParams.delete("host");
    return { proxy, url: url.toString() };
  }

  /** Lose the reply to the next execution of a statement containing `sql`. */
  arm(sql: string): void {
    this.#armed = sql;
  }

  get armed(): boolean {
    return this.#armed !== undefined;
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }

  #pipe(client: net.Socket, upstream: URL): void {
    const host = upstream.searchParams.get("host") ?? upstream.hostname;
    const server = host.startsWith("/")
      ? net.connect({ path: `${host}/.s.PGSQL.${upstream.port || 5432}` })
      : net.connect({ host, port: Number(upstream.port || 5432) });
    const statements = new Map<string, string>();
    let started = false;
    let pending = Buffer.alloc(0);
    let cutting = false;
    client.on("data", (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      if (!started) {
        // The startup packet (and an SSL request) have no type byte.
        while (!started && pending.length >= 4 && pending.length >= pending.readInt32BE(0)) {
          const length = pending.readInt32BE(0);
          const code = pending.length >= 8 ? pending.readInt32BE(4) : 0;
          pending = pending.subarray(length);
          if (code === 196608) started = true; // protocol 3.0
        }
      }
      while (started && pending.length >= 5 && pending.length >= 1 + pending.readInt32BE(1)) {
        const type = String.fromCharCode(pending[0]!);
        const body = pending.subarray(5, 1 + pending.readInt32BE(1));
        pending = pending.subarray(1 + pending.readInt32BE(1));
        const [first = "", second = ""] = body.toString("utf8").split("\0");
        if (type === "P") statements.set(first, second);
        if ((type === "B" && this.#armed && (statements.get(second) ?? "").includes(this.#armed)) ||
            (type === "Q" && this.#armed && first.includes(this.#armed))) {
          this.#armed = undefined;
          cutting = true;
        }
      }
      server.write(chunk);
    });
    server.on("data", (chunk: Buffer) => {
      if (cutting) {
        // Swallow the reply; once its ReadyForQuery went by, drop the line.
        if (chunk.includes(Buffer.from([0x5a, 0, 0, 0, 5]))) {
          this.cuts += 1;
          client.destroy();
          server.destroy();
        }
        return;
      }
      client.write(chunk);
    });
    client.on("error", () => server.destroy());
    server.on("error", () => client.destroy());
    client.on("close", () => server.destroy());
    server.on("close", () => client.destroy());
  }
}
