// What a handler receives (Job), what it may throw to decide its run's write
// (Suspend, Retry, Snooze), and the durable steps it may take.

import { createHash } from "node:crypto";

import type { Client } from "./client.js";
import { type Fence, fenceOf } from "./inputs.js";
import type { ClaimedAttempt, JsonValue, StepOutcome } from "./generated/sqlApi.js";
import { isConnectionError, sleep } from "./retry.js";

/** Throw from a handler to suspend the run on a typed wait. `sleep`, `event`
 * and `detached` take seconds, counted from the database clock when the
 * suspension is written; a `wait` given whole is written as given. */
export class Suspend extends Error {
  readonly wait: Record<string, unknown>;
  readonly finalEvents: readonly unknown[];
  /** [key, seconds]: the wait's deadline, seconds after the write. */
  readonly deadline: readonly [string, number] | undefined;
  /** The handler's last step, run once suspend_attempt answered `waiting`
   * (work that must start only after the wait is recorded, such as asking
   * for the approval the run waits for). If it throws, the waiting run is
   * failed with Client.failWaiting, unless its wait ended first. It runs at
   * most once: a worker that dies meanwhile leaves the run waiting. */
  readonly onWaiting: (() => unknown) | undefined;

  constructor(
    wait: Record<string, unknown>,
    options: {
      finalEvents?: readonly unknown[];
      deadline?: readonly [string, number];
      onWaiting?: () => unknown;
    } = {},
  ) {
    super(String(wait["kind"] ?? "wait"));
    this.name = "Suspend";
    this.wait = wait;
    this.finalEvents = options.finalEvents ?? [];
    this.deadline = options.deadline;
    this.onWaiting = options.onWaiting;
  }

  /** Sleep `seconds` by the database clock. */
  static sleep(seconds: number, onWaiting?: () => unknown): Suspend {
    return new Suspend({ kind: "sleep" }, { deadline: ["until", seconds], ...(onWaiting ? { onWaiting } : {}) });
  }

  /** Wait for signal `name`, at most `timeout` seconds. */
  static event(name: string, timeout?: number, onWaiting?: () => unknown): Suspend {
    return new Suspend(
      { kind: "event", name },
      { ...(timeout === undefined ? {} : { deadline: ["timeout_at", timeout] as const }), ...(onWaiting ? { onWaiting } : {}) },
    );
  }

  /** Wait for detached runner `runner`, at most `timeout` seconds. */
  static detached(runner: string, timeout?: number, onWaiting?: () => unknown): Suspend {
    return new Suspend(
      { kind: "detached_runner", runner },
      { ...(timeout === undefined ? {} : { deadline: ["timeout_at", timeout] as const }), ...(onWaiting ? { onWaiting } : {}) },
    );
  }

  /** The wait as written, its deadline counted from `now` (the database clock). */
  waitFrom(now: Date): Record<string, unknown> {
    if (this.deadline === undefined) return this.wait;
    const [key, seconds] = this.deadline;
    return { ...this.wait, [key]: new Date(now.getTime() + seconds * 1000).toISOString() };
  }
}

/** Throw to fail this attempt and retry the run `after` seconds from now. */
export class Retry extends Error {
  constructor(
    message = "retry",
    readonly after = 0,
  ) {
    super(message);
    this.name = "Retry";
  }
}

/** Throw to hand the run back, to run again `after` seconds from now,
 * without consuming an attempt. */
export class Snooze extends Error {
  constructor(
    readonly after: number,
    readonly reason?: string,
  ) {
    super(reason ?? "snooze");
    this.name = "Snooze";
  }
}

/** The handler ran past its timeout: its attempt fails with a timeout error. */
export class HandlerTimeout extends Error {
  constructor(readonly seconds: number) {
    super(`the handler ran past its timeout of ${seconds}s`);
    this.name = "HandlerTimeout";
  }
}

/** The attempt no longer holds its run (cancelled, or its lease lost). */
export class RunCancelled extends Error {
  constructor(readonly outcome: string) {
    super(`the run was ${outcome === "cancelled" ? "cancelled" : "taken from this attempt"} while its handler ran`);
    this.name = "RunCancelled";
  }
}

/** A step used wrongly: a bad or repeated name, a result that is not JSON. */
export class StepError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StepError";
  }
}

/** record_step answered that this attempt no longer holds its run. */
export class StepLost extends Error {
  constructor(
    readonly step: string,
    readonly outcome: string,
  ) {
    super(`step ${step}: the attempt no longer holds its run (${outcome})`);
    this.name = "StepLost";
  }
}

const STEP_NAME_MAX = 200;
const STEP_KEY_MAX = 255;
// record_step after a lost connection: the same call again (an exact replay
// when the lost one committed), this many times, these milliseconds apart.
const RECORD_RETRIES = [200, 500, 1000, 2000, 5000];

/** One claimed attempt of a run, as its handler sees it. */
export class Job<P = JsonValue> {
  readonly attempt: ClaimedAttempt;
  readonly #client: Client;
  readonly #controller = new AbortController();
  readonly #steps: Record<string, JsonValue>;
  readonly #names = new Set<string>();
  #resumeTaken = false;
  // The database clock at the claim, and this process's clock then.
  readonly #dbClaimedAt: number;
  readonly #claimedAt = performance.now();

  constructor(attempt: ClaimedAttempt, client: Client, leaseSeconds: number) {
    this.attempt = attempt;
    this.#client = client;
    this.#steps = { ...((attempt.steps as Record<string, JsonValue> | null) ?? {}) };
    this.#dbClaimedAt = attempt.lease_expires_at.getTime() - leaseSeconds * 1000;
  }

  get runId(): string {
    return this.attempt.run_id;
  }

  get payload(): P {
    return this.attempt.payload as P;
  }

  /** What woke the run: a signal {name, payload}, {slept: true},
   * {timed_out: true}, a runner terminal; null on a first start. */
  get resume(): JsonValue {
    return this.attempt.resume;
  }

  get fence(): Fence {
    return fenceOf(this.attempt);
  }

  /** Aborted when the run is cancelled, the lease is lost, the handler's
   * timeout passes or the worker hands the run back at shutdown. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** @internal */
  abort(reason: Error): void {
    if (!this.#controller.signal.aborted) this.#controller.abort(reason);
  }

  /** The database's clock now, as the claim's lease told it. */
  dbNow(): Date {
    return new Date(this.#dbClaimedAt + (performance.now() - this.#claimedAt));
  }

  /** The run's recorded steps, step name → result. */
  get steps(): Readonly<Record<string, JsonValue>> {
    return this.#steps;
  }

  /** The idempotency key of step `name`: the same on every attempt of the
   * run (`<run_id>:<name>`, hashed past 255 characters). */
  stepKey(name: string): string {
    const key = `${this.runId}:${name}`;
    return key.length <= STEP_KEY_MAX
      ? key
      : `sha256:${createHash("sha256").update(key).digest("hex")}`;
  }

  /** The result of step `name`: the recorded one, or `fn()`'s, recorded now. */
  async step<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
    this.#use(name);
    if (Object.hasOwn(this.#steps, name)) return this.#steps[name] as T;
    return (await this.#record(name, await fn())) as T;
  }

  /** Sleep `seconds` by the database clock as step `name`: the run waits
   * without holding a worker, and the attempt after the wake goes on. */
  async sleep(name: string, seconds: number): Promise<void> {
    this.#use(name);
    await this.#wait(name, () => Suspend.sleep(seconds), (resume) => {
      if (!isObject(resume) || resume["slept"] !== true) {
        throw new StepError(
          `this sleep step found the wake of another wait (${JSON.stringify(resume)}): code between steps must be deterministic`,
        );
      }
      return undefined;
    });
  }

  /** Wait for the signal `event` as step `name`, at most `timeout` seconds:
   * the signal's payload, or null when the wait timed out. */
  async waitForEvent(name: string, event: string, options: { timeout?: number } = {}): Promise<JsonValue> {
    this.#use(name);
    return this.#wait(name, () => Suspend.event(event, options.timeout), (resume) => {
      if (isObject(resume) && resume["timed_out"] === true) return null;
      if (isObject(resume) && resume["name"] === event) return (resume["payload"] ?? null) as JsonValue;
      throw new StepError(
        `step ${name} waits for signal ${event} but found the wake of another wait (${JSON.stringify(resume)}): code between steps must be deterministic`,
      );
    });
  }

  #use(name: string): void {
    if (typeof name !== "string" || !name.trim() || name.length > STEP_NAME_MAX) {
      throw new StepError(`a step name is a non-blank string of at most ${STEP_NAME_MAX} characters, not ${JSON.stringify(name)}`);
    }
    if (this.#names.has(name)) {
      throw new StepError(
        `step ${name} is used twice in one attempt: a name names one step of a run (in a loop, add the index: \`poll-\${i}\`)`,
      );
    }
    this.#names.add(name);
  }

  async #wait<T>(name: string, suspend: () => Suspend, delivered: (resume: JsonValue) => T): Promise<T> {
    if (Object.hasOwn(this.#steps, name)) return delivered(this.#steps[name] ?? null);
    // The wake is the first unrecorded wait's: the code before it replayed
    // to the same line.
    const resume = this.#resumeTaken ? null : this.attempt.resume;
    this.#resumeTaken = true;
    if (resume === null) throw suspend();
    delivered(resume);
    return delivered((await this.#record(name, resume)) as JsonValue);
  }

  async #record(name: string, value: unknown): Promise<unknown> {
    const result = value === undefined ? null : value;
    let text: string;
    try {
      text = JSON.stringify(result);
    } catch (error) {
      throw new StepError(`step ${name}: its result is not JSON (${String(error)})`);
    }
    const stored = JSON.parse(text) as JsonValue;
    let outcome: StepOutcome | undefined;
    for (const delay of [...RECORD_RETRIES, undefined]) {
      try {
        outcome = await this.#client.recordStep({ ...this.fence, step: name, result: stored });
        break;
      } catch (error) {
        if (delay === undefined || !isConnectionError(error)) throw error;
        await sleep(delay);
      }
    }
    if (outcome === "recorded") {
      this.#steps[name] = stored;
      this.#resumeTaken = true;
      return stored;
    }
    if (outcome === "already_recorded") {
      throw new StepError(
        `step ${name} was already recorded for this run with another result (a name used for two steps?)`,
      );
    }
    this.abort(new RunCancelled(String(outcome)));
    throw new StepLost(name, String(outcome));
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
