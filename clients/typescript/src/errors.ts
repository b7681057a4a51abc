// Typed errors for the SQLSTATEs runrelay's functions raise: the classes of
// docs/errors.md, one per row of the generated ERROR_TABLE (a test keeps the
// two equal). Each keeps the server's message, hint, detail and the
// parameter it names (PostgreSQL's COLUMN field, which runrelay sets to the
// offending argument), and the driver's error as `cause`.

import { ERROR_TABLE, PARAMETER, PLPROXY_CONNECTION, REMOTE, SHARD, SHARD_GONE } from "./generated/errors.js";

export interface ErrorFields {
  readonly sqlstate?: string;
  readonly hint?: string | undefined;
  readonly detail?: string | undefined;
  readonly parameter?: string | undefined;
  readonly cause?: unknown;
}

/** Base class: an error raised by a runrelay call. */
export class RunrelayError extends Error {
  static readonly sqlstate: string | undefined = undefined;
  readonly sqlstate: string | undefined;
  readonly hint: string | undefined;
  readonly detail: string | undefined;
  readonly parameter: string | undefined;

  constructor(message: string, fields: ErrorFields = {}) {
    super(fields.hint ? `${message} (hint: ${fields.hint})` : message, { cause: fields.cause });
    this.name = new.target.name;
    this.sqlstate = fields.sqlstate ?? (new.target as typeof RunrelayError).sqlstate;
    this.hint = fields.hint;
    this.detail = fields.detail;
    this.parameter = fields.parameter;
  }
}

/** Bad input: the call changed nothing; `parameter` names the argument. */
export class InvalidArgument extends RunrelayError {
  static override readonly sqlstate = "22023";
}

/** A JSON argument exceeds settings.max_payload_bytes; nothing changed. */
export class PayloadTooLarge extends RunrelayError {
  static override readonly sqlstate = "54000";
}

/** runrelay functions require READ COMMITTED; nothing changed. */
export class WrongIsolation extends RunrelayError {
  static override readonly sqlstate = "25000";
}

/** A lock wait outlasted the function's bound or the caller's lock_timeout. */
export class LockTimeout extends RunrelayError {
  static override readonly sqlstate = "55P03";
}

/** The statement was cancelled by statement_timeout; nothing changed. */
export class StatementTimeout extends RunrelayError {
  static override readonly sqlstate = "57014";
}

/** The role may not call this function (docs/security.md). */
export class PermissionDenied extends RunrelayError {
  static override readonly sqlstate = "42501";
}

/** The runrelay schema or function does not exist: run `runrelay migrate`. */
export class SchemaMissing extends RunrelayError {
  static override readonly sqlstate = "42883";
}

/** Sharded install: a shard the call needs is down or unreachable from the
 * proxy. The call did not complete there: repeat it (replays are exact). */
export class ShardUnavailable extends RunrelayError {
  static override readonly sqlstate = "08006";
  readonly shard: number | undefined;

  constructor(message: string, fields: ErrorFields & { shard?: number | undefined } = {}) {
    super(message, fields);
    this.shard = fields.shard;
  }
}

/** A client-side refusal: the arguments cannot make a valid call, so no SQL
 * was sent (an unknown or missing argument, a timestamp without an offset). */
export class ClientArgumentError extends TypeError {
  constructor(
    message: string,
    readonly parameter: string,
  ) {
    super(message);
    this.name = "ClientArgumentError";
  }
}

/** The classes of ERROR_TABLE, by name. */
export const ERROR_CLASSES: Readonly<Record<string, typeof RunrelayError>> = {
  InvalidArgument,
  PayloadTooLarge,
  WrongIsolation,
  LockTimeout,
  StatementTimeout,
  PermissionDenied,
  SchemaMissing,
  ShardUnavailable,
};

const BY_SQLSTATE = new Map<string, typeof RunrelayError>(
  ERROR_TABLE.map((row) => {
    const cls = ERROR_CLASSES[row.name];
    if (cls === undefined || cls.sqlstate !== row.sqlstate) {
      throw new Error(`runrelay: error class ${row.name} does not match ERROR_TABLE`);
    }
    return [row.sqlstate, cls];
  }),
);
BY_SQLSTATE.set("3F000", SchemaMissing); // invalid_schema_name

interface DriverError {
  readonly code?: string;
  readonly message: string;
  readonly hint?: string;
  readonly detail?: string;
  readonly column?: string;
}

function isDriverError(error: unknown): error is DriverError {
  return error instanceof Error && typeof (error as { code?: unknown }).code === "string";
}

function unwrap(text: string | undefined, prefix: string): string | undefined {
  return text !== undefined && text.startsWith(prefix) ? text.slice(prefix.length) : text;
}

/** The typed error for a driver error, or the error itself when runrelay
 * has no class for its SQLSTATE. */
export function translate(error: unknown, shard?: number): unknown {
  if (!isDriverError(error)) return error;
  const sqlstate = error.code ?? "";
  let message = error.message;
  if (sqlstate === "XX000" && PLPROXY_CONNECTION.test(message)) {
    return new ShardUnavailable(message, { sqlstate, shard, cause: error });
  }
  const remote = REMOTE.exec(message);
  if (SHARD_GONE.has(sqlstate) && remote !== null) {
    return new ShardUnavailable(message, { sqlstate, shard, cause: error });
  }
  const cls = BY_SQLSTATE.get(sqlstate);
  if (cls === undefined) return error;
  let { hint, detail, column: parameter } = error;
  if (remote !== null) {
    message = message.slice(remote[0].length);
    hint = unwrap(hint, "Remote hint: ");
    detail = unwrap(detail, "Remote detail: ");
    const found = PARAMETER[sqlstate]?.exec(message);
    if (parameter === undefined && found) parameter = found[1];
  }
  if (cls === ShardUnavailable) {
    const named = SHARD.exec(message);
    return new ShardUnavailable(message, {
      sqlstate,
      hint,
      detail,
      cause: error,
      shard: named ? Number(named[1]) : shard,
    });
  }
  return new cls(message, { sqlstate, hint, detail, parameter, cause: error });
}
