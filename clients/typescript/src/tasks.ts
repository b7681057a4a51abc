// Named tasks (SPEC §3.5): a registry of handlers a Worker runs, each run
// naming its task, so a worker never claims a run it has no handler for.

import { randomUUID } from "node:crypto";

import type { Client, Queryable } from "./client.js";
import type { EnqueueResult, EnqueueRunArgs, JsonValue } from "./generated/sqlApi.js";
import type { Job } from "./job.js";

export type Handler<P = JsonValue> = (job: Job<P>) => unknown;

export interface TaskOptions {
  /** The queue its runs are enqueued on (default "default"). */
  readonly queue?: string;
  /** max_attempts of its runs (default 3). */
  readonly maxAttempts?: number;
  /** Seconds an attempt may run before it fails with a timeout error. */
  readonly timeout?: number;
}

export class Task<P = JsonValue> {
  constructor(
    readonly name: string,
    readonly fn: Handler<P>,
    readonly queue: string,
    readonly maxAttempts: number,
    readonly timeout: number | undefined,
  ) {}

  /** Enqueue a run of this task (in the caller's transaction with `conn`). */
  enqueue(
    client: Client,
    payload: P,
    options: Omit<EnqueueRunArgs, "run_id" | "payload" | "task" | "queue"> & { run_id?: string } = {},
    conn?: Queryable,
  ): Promise<EnqueueResult | null> {
    return client.enqueueRun(
      {
        max_attempts: this.maxAttempts,
        ...options,
        run_id: options.run_id ?? randomUUID(),
        queue: this.queue,
        payload,
        task: this.name,
      },
      conn,
    );
  }
}

export class UnknownTask extends Error {
  constructor(readonly task: string | null) {
    super(`no task ${JSON.stringify(task)} in this worker's registry`);
    this.name = "UnknownTask";
  }
}

/** A registry of tasks: `tasks.define("send_email", async (job) => ...)`. */
export class Tasks {
  readonly #tasks = new Map<string, Task<never>>();

  define<P = JsonValue>(name: string, fn: Handler<P>, options: TaskOptions = {}): Task<P> {
    if (typeof name !== "string" || name.length < 1 || name.length > 200) {
      throw new TypeError(`a task name is 1 to 200 characters, not ${JSON.stringify(name)}`);
    }
    if (this.#tasks.has(name)) throw new TypeError(`task ${name} is defined twice`);
    if (options.timeout !== undefined && !(options.timeout > 0)) {
      throw new TypeError(`task ${name}: timeout must be a positive number of seconds`);
    }
    const task = new Task<P>(name, fn, options.queue ?? "default", options.maxAttempts ?? 3, options.timeout);
    this.#tasks.set(name, task as unknown as Task<never>);
    return task;
  }

  get size(): number {
    return this.#tasks.size;
  }

  get names(): string[] {
    return [...this.#tasks.keys()].sort();
  }

  /** The queues of the tasks, each once. */
  get queues(): string[] {
    return [...new Set([...this.#tasks.values()].map((t) => t.queue))].sort();
  }

  get(name: string | null): Task<never> | undefined {
    return name === null ? undefined : this.#tasks.get(name);
  }
}
