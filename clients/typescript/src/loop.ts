// What the Worker and the Relay share: a name, stop() and the signals that
// call it (a second stop ends the grace period), run() once at a time, the
// wake-ups that end an idle wait, and repeating a call after a lost
// connection with the same call_id.

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";

import type { Client } from "./client.js";
import type { ListenConfig } from "./listen.js";
import { backoff, isConnectionError, sleep } from "./retry.js";

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

// Tries of a call that lost its connection, the first included.
const TRIES = 6;

export abstract class Loop {
  readonly client: Client;
  readonly name: string;
  protected readonly log: Logger;
  protected readonly listenConfig: ListenConfig | undefined;
  protected stopping = false;
  /** Aborted by a second stop(): the grace period ends. */
  protected hurry = new AbortController();
  #waker = new AbortController();
  #running: Promise<void> | undefined;

  constructor(
    client: Client,
    options: { name?: string; listen?: ListenConfig | boolean; logger?: Logger },
    private readonly kind: string,
  ) {
    this.client = client;
    this.name = options.name ?? `${hostname()}:${process.pid}:${randomUUID().replaceAll("-", "").slice(0, 6)}`;
    this.log = options.logger ?? console;
    // No LISTEN unless asked for, as in the Python loops: every listening
    // session of a database is woken by every NOTIFY in it, whatever its
    // channel (PostgreSQL's design), so listeners cost the server. `true`
    // takes the pool's settings for its own connection (never a pooled one).
    const pool = (client.pool as { options?: Record<string, unknown> }).options;
    const { max: _max, idleTimeoutMillis: _idle, ...config } = pool ?? {};
    if (options.listen === true && pool === undefined) {
      throw new TypeError("listen: true needs a pg.Pool; pass a connection string or config instead");
    }
    this.listenConfig =
      options.listen === true ? (config as ListenConfig) : options.listen === false ? undefined : options.listen;
  }

  /** End the loop; a second call ends the grace period at once. */
  stop(): void {
    if (this.stopping) this.hurry.abort();
    this.stopping = true;
    this.wake();
  }

  /** stop() on SIGINT and SIGTERM. */
  installSignalHandlers(): void {
    const onSignal = (signal: string): void => {
      this.log.info(`runrelay ${this.kind} ${this.name}: ${signal}, ${this.stopping ? "hurrying" : "stopping"}`);
      this.stop();
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
  }

  /** Run until stop(), or with `untilIdle`, once the loop had nothing to
   * do for that many seconds. */
  run(options: { untilIdle?: number } = {}): Promise<void> {
    if (this.#running === undefined) {
      this.stopping = false;
      this.hurry = new AbortController();
      this.#running = this.loop(options.untilIdle).finally(() => {
        this.#running = undefined;
      });
    }
    return this.#running;
  }

  protected abstract loop(untilIdle: number | undefined): Promise<void>;

  /** End the current idle() waits. */
  protected wake(): void {
    this.#waker.abort();
    this.#waker = new AbortController();
  }

  protected idle(ms: number): Promise<void> {
    return sleep(ms, this.#waker.signal);
  }

  /** A call, repeated after a lost connection with the same call_id: one
   * whose reply was lost answers exactly what the lost one did. */
  protected async retried<T>(call: (callId: string) => Promise<T>): Promise<T> {
    const callId = randomUUID();
    for (let n = 0; ; n++) {
      try {
        return await call(callId);
      } catch (error) {
        if (!isConnectionError(error) || n + 1 >= TRIES) throw error;
        await sleep(backoff(n));
      }
    }
  }
}
