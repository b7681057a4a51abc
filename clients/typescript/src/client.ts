// The client: every SQL function of runrelay as one method, one statement
// (one round trip) per call, on a node-postgres pool or on the caller's own
// connection, inside its transaction.

import { createHash } from "node:crypto";
import pg from "pg";

import { ClientArgumentError, translate } from "./errors.js";
import { type FailOutcome, SQL_API, SqlCalls } from "./generated/sqlApi.js";
import type { Fence } from "./inputs.js";

/** A connection to run one call on: the client's pool, a pool's client
 * (checked out by the caller, perhaps inside BEGIN ... COMMIT) or a Client. */
export type Queryable = pg.Pool | pg.PoolClient | pg.Client;

export interface ClientOptions {
  /** The schema runrelay was migrated into (default "runrelay"). */
  readonly schema?: string;
  /** Name each statement, so the server parses and plans it once per
   * connection (default true). Turn it off behind a pooler that does not
   * keep prepared statements across transactions. */
  readonly prepare?: boolean;
}

// bigint columns (event ids, sequence numbers, milliseconds) arrive as
// numbers; a value past 2^53 would lose digits, so it is refused instead.
function int8(text: string): number {
  const value = Number(text);
  if (!Number.isSafeInteger(value)) {
    throw new RangeError(`runrelay: bigint ${text} does not fit a JavaScript number`);
  }
  return value;
}

const INT8 = 20;
const defaultParser = pg.types.getTypeParser as (
  oid: number,
  format: "text" | "binary",
) => (value: string) => unknown;
const INT8_ARRAY = 1016;
const TYPES = {
  getTypeParser(oid: number, format?: "text" | "binary"): (value: string) => unknown {
    if (oid === INT8) return int8;
    if (oid === INT8_ARRAY) {
      const parse = defaultParser(INT8_ARRAY, "text") as (v: string) => (string | null)[];
      return (value: string) => parse(value).map((v) => (v === null ? null : int8(v)));
    }
    return defaultParser(oid, format ?? "text");
  },
};

// A timestamp given as text must say its offset: without one the server
// would read it in its own time zone and run the work hours early or late.
const OFFSET = /(?:[zZ]|[+-]\d{2}(?::?\d{2})?)$/;

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

interface Statement {
  readonly name: string | undefined;
  readonly text: string;
}

/** The runrelay client: `client.enqueueRun({ run_id: "r1" })`. */
export class Client extends SqlCalls<Queryable> {
  readonly schema: string;
  readonly prepare: boolean;
  readonly pool: Queryable;
  readonly #statements = new Map<string, Statement>();

  constructor(pool: Queryable, options: ClientOptions = {}) {
    super();
    this.pool = pool;
    this.schema = options.schema ?? "runrelay";
    this.prepare = options.prepare ?? true;
  }

  /** The statement of a call with the given parameters sent (the others
   * take their SQL defaults), built once per shape. */
  statement(fn: string, sent: readonly string[]): Statement {
    const key = `${fn}(${sent.join(",")})`;
    let statement = this.#statements.get(key);
    if (statement === undefined) {
      const spec = SQL_API[fn]!;
      const types = new Map(spec.params.map(([name, type]) => [name, type]));
      const args = sent.map((name, i) => `${quoteIdent(name)} => $${i + 1}::${types.get(name)}`);
      const target = `${quoteIdent(this.schema)}.${quoteIdent(fn)}(${args.join(", ")})`;
      const text = spec.rows ? `SELECT * FROM ${target}` : `SELECT ${target} AS value`;
      const name = this.prepare
        ? `runrelay_${createHash("sha1").update(text).digest("hex").slice(0, 24)}`
        : undefined;
      statement = { name, text };
      this.#statements.set(key, statement);
    }
    return statement;
  }

  /** The statement and its values for a call: refuses, before any SQL, an
   * argument the function does not have, a missing required one, and a
   * timestamp string without an offset. */
  bind(fn: string, args: object): { statement: Statement; values: unknown[] } {
    const spec = SQL_API[fn];
    if (spec === undefined) throw new ClientArgumentError(`runrelay: no function ${fn}`, fn);
    const given = args as Record<string, unknown>;
    const known = new Set(spec.params.map(([name]) => name));
    for (const name of Object.keys(given)) {
      if (!known.has(name)) {
        throw new ClientArgumentError(`runrelay: ${fn} has no argument ${name}`, name);
      }
    }
    const sent: string[] = [];
    const values: unknown[] = [];
    for (const [name, type, fallback] of spec.params) {
      const value = given[name];
      if (value === undefined) {
        if (fallback === null) {
          throw new ClientArgumentError(`runrelay: ${fn} needs ${name}`, name);
        }
        continue;
      }
      sent.push(name);
      if (value === null) {
        values.push(null);
      } else if (type === "jsonb") {
        values.push(JSON.stringify(value));
      } else if (type === "timestamp with time zone" && typeof value === "string" && !OFFSET.test(value)) {
        throw new ClientArgumentError(
          `runrelay: ${name} must carry a UTC offset (like 2026-01-01T00:00:00Z), got ${value}`,
          name,
        );
      } else {
        values.push(value);
      }
    }
    return { statement: this.statement(fn, sent), values };
  }

  /** Fail an attempt whose run waits on its suspension, unless the wait
   * ended first (a signal or timeout wins): prepare_waiting_failure, then
   * fail_attempt(protect_waiting_suspension => true); two calls, the one
   * documented exception to one round trip. The answer is the protected
   * failure's, the same on every repeat. */
  async failWaiting(
    args: Fence & { error: unknown; retry_at?: Date | string | null; final_events?: unknown },
    conn?: Queryable,
  ): Promise<FailOutcome> {
    const fence = { run_id: args.run_id, attempt: args.attempt, lease_token: args.lease_token };
    await this.prepareWaitingFailure(fence, conn);
    return this.failAttempt({ ...args, protect_waiting_suspension: true }, conn);
  }

  protected async call(fn: string, args: object, conn: Queryable | undefined): Promise<unknown> {
    const { statement, values } = this.bind(fn, args);
    let result: pg.QueryResult;
    try {
      result = await (conn ?? this.pool).query({
        name: statement.name,
        text: statement.text,
        values,
        types: TYPES,
      } as pg.QueryConfig);
    } catch (error) {
      throw translate(error);
    }
    const rows = result.rows as Record<string, unknown>[];
    switch (SQL_API[fn]!.shape) {
      case "scalar":
        return rows[0]?.["value"] ?? null;
      case "one":
        return rows[0] ?? null;
      default:
        return rows;
    }
  }
}
