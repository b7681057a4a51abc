// The Worker loop: claim runs, run a handler per run, heartbeat, write the
// outcome. The same semantics as the Python Worker (docs/python-client.md):
//
//   returns a value       -> complete_attempt(result)          (undefined -> {})
//   throws Suspend        -> suspend_attempt(wait)
//   throws Retry(after)   -> fail_attempt(retry_at = now + after)
//   throws Snooze(after)  -> release_attempt(run_at = now + after): no attempt used
//   throws anything else  -> fail_attempt(error): retried with backoff until max_attempts
//
// Round trips: a job's write and the claim of the run that takes its slot
// are one settle_and_claim call while there is work; writes that finish
// while a call is in flight share the next (at most SETTLE_CALLS in flight).
// Runs claimed together are settled together: a call waits, at most
// GATHER_MS, for the handlers of runs claimed less than that ago that are
// still running, as the Python Worker's does (GATHER_SECONDS there).
// claim_attempts only fills free slots at the start and after an idle wait,
// which a NOTIFY on <schema>_runs ends early. Every claim carries a call_id,
// so one repeated after a lost connection answers exactly what the lost one
// did and no run is claimed twice.
//
// Cancellation: a cancel_run on a held run notifies <schema>_cancel; the
// job's AbortSignal fires at once (else at the next heartbeat), the worker
// stops waiting for the handler and writes the attempt, which answers
// `cancelled`. Shutdown (stop(), SIGINT/SIGTERM): claiming ends, in-flight
// handlers get shutdownGrace seconds, then the rest are handed back with
// release_attempt, which does not consume an attempt.

import type { Client } from "./client.js";
import { RunrelayError } from "./errors.js";
import type { ClaimedAttempt, JsonValue, SettleAndClaimRow } from "./generated/sqlApi.js";
import type { SettleItem } from "./inputs.js";
import { HandlerTimeout, Job, Retry, RunCancelled, Snooze, Suspend } from "./job.js";
import { type ListenConfig, Listener } from "./listen.js";
import { Loop, type Logger } from "./loop.js";
import { sleep } from "./retry.js";
import { type Handler, Tasks, UnknownTask } from "./tasks.js";

export interface WorkerOptions {
  /** Queues to claim from (default: the tasks' queues, or every queue). */
  readonly queues?: readonly string[];
  /** Handlers running at once (default 10). */
  readonly concurrency?: number;
  /** Runs one claim may take (default 1). */
  readonly batchSize?: number;
  /** The worker's name in attempts and list_processes (default host:pid:random). */
  readonly name?: string;
  /** Lease length in seconds (default 30, the server clamps to 5..300). */
  readonly leaseSeconds?: number;
  /** Seconds between heartbeats (default leaseSeconds / 3, at least 1). */
  readonly heartbeatEvery?: number;
  /** Seconds between polls when idle (default 1; a NOTIFY ends the wait early). */
  readonly pollInterval?: number;
  /** LISTEN for wake-ups (new runs, and cancellations of held runs, which
   * then abort at once rather than at the next heartbeat): a connection
   * string or pg config for its own connection, or true for the pool's
   * settings. Default: none, poll only. */
  readonly listen?: ListenConfig | boolean;
  /** Seconds in-flight handlers get to finish at shutdown (default 10). */
  readonly shutdownGrace?: number;
  /** Reap expired leases, enqueue due schedules, record queue activity
   * (default true). */
  readonly maintenance?: boolean;
  /** Seconds between maintenance rounds (default leaseSeconds / 2, 1..30). */
  readonly maintenanceInterval?: number;
  /** Seconds a handler may run (a task's own timeout wins). */
  readonly timeout?: number;
  /** Write and claim in one settle_and_claim call (default true). */
  readonly fused?: boolean;
  readonly logger?: Logger;
}

const SETTLE_CALLS = 2;
// Gathering: a call waits at most this long for the handlers of runs
// claimed less than this long ago that still run, so that short jobs claimed
// together settle in one call, not the first alone and the rest behind it.
// A handler that runs longer is not waited for.
const GATHER_MS = 10;
const MESSAGE_CHARS = 2000;
const TRACEBACK_CHARS = 8000;
const REASON_CHARS = 2000;

type Method = "complete_attempt" | "fail_attempt" | "suspend_attempt" | "release_attempt";

interface Write {
  readonly method: Method;
  readonly args: Record<string, unknown>;
}

interface Held {
  readonly job: Job;
  // When the run was claimed (performance.now()): a call gathers the
  // outcomes of runs claimed less than gatherMs ago.
  readonly claimedAt: number;
  settling: boolean;
  handedBack: boolean;
  beating: boolean;
}

interface Settlement {
  readonly held: Held;
  readonly write: Write;
  readonly done: () => void;
}

class Shutdown extends Error {
  constructor() {
    super("the worker is shutting down");
    this.name = "Shutdown";
  }
}

export function errorOf(error: unknown): Record<string, string> {
  if (error instanceof Error) {
    return {
      type: error.name,
      message: error.message.slice(0, MESSAGE_CHARS),
      traceback: (error.stack ?? "").slice(-TRACEBACK_CHARS),
    };
  }
  return { type: typeof error, message: String(error).slice(0, MESSAGE_CHARS) };
}

/** The one write a handler's outcome calls for. */
export function writeFor(job: Job, outcome: { value?: unknown; error?: unknown }): Write {
  const fence = job.fence;
  const error = outcome.error;
  if ("value" in outcome && !("error" in outcome)) {
    return { method: "complete_attempt", args: { ...fence, result: outcome.value ?? {} } };
  }
  if (error instanceof HandlerTimeout) {
    return {
      method: "fail_attempt",
      args: {
        ...fence,
        error: { type: "timeout", message: error.message, timeout_seconds: error.seconds },
      },
    };
  }
  if (error instanceof RunCancelled) {
    return { method: "fail_attempt", args: { ...fence, error: { type: "cancelled", message: error.message } } };
  }
  if (error instanceof Suspend) {
    return {
      method: "suspend_attempt",
      args: { ...fence, wait: error.waitFrom(job.dbNow()), final_events: error.finalEvents },
    };
  }
  if (error instanceof Retry) {
    const retryAt = new Date(job.dbNow().getTime() + error.after * 1000);
    return {
      method: "fail_attempt",
      args: { ...fence, error: { type: "Retry", message: error.message }, retry_at: retryAt.toISOString() },
    };
  }
  if (error instanceof Snooze) {
    const runAt = new Date(job.dbNow().getTime() + error.after * 1000);
    return releaseWrite(job, runAt, error.reason, "Snooze");
  }
  return { method: "fail_attempt", args: { ...fence, error: errorOf(error) } };
}

function releaseWrite(job: Job, runAt: Date | null, reason: string | undefined, kind: string): Write {
  const text = !reason || reason === kind ? kind : `${kind}: ${reason}`;
  return {
    method: "release_attempt",
    args: { ...job.fence, run_at: runAt?.toISOString() ?? null, reason: text.slice(0, REASON_CHARS) },
  };
}

const OPS: Record<Method, SettleItem["op"]> = {
  complete_attempt: "complete",
  fail_attempt: "fail",
  suspend_attempt: "suspend",
  release_attempt: "release",
};

function settleItem(write: Write): SettleItem {
  const item: Record<string, unknown> = { op: OPS[write.method] };
  for (const [key, value] of Object.entries(write.args)) {
    if (value === null || value === undefined) continue;
    if (key === "final_events" && Array.isArray(value) && value.length === 0) continue;
    item[key] = value;
  }
  return item as unknown as SettleItem;
}

export class Worker extends Loop {
  readonly queues: readonly string[] | undefined;
  readonly tasks: Tasks | undefined;
  readonly concurrency: number;
  readonly batchSize: number;
  readonly leaseSeconds: number;
  readonly heartbeatEvery: number;
  readonly pollInterval: number;
  readonly shutdownGrace: number;
  readonly timeout: number | undefined;
  readonly fused: boolean;
  readonly stats = { claimed: 0, completed: 0, failed: 0, handedBack: 0, calls: 0 };
  readonly #handler: Handler<never> | undefined;
  readonly #maintenance: number | undefined;
  readonly #held = new Map<string, Held>();
  readonly #queued: Settlement[] = [];
  #settleCalls = 0;
  // Set while the next call waits for young handlers (#gathering).
  #gatherTimer: ReturnType<typeof setTimeout> | undefined;
  /** How long a call gathers, in ms (GATHER_MS; 0: not at all). */
  gatherMs = GATHER_MS;
  // Aborted once the loop ended: ends the maintenance loop's sleep.
  #ended = new AbortController();
  #waitingForSlot = false;
  readonly #handlers = new Set<Promise<void>>();

  constructor(client: Client, handler: Handler<never> | Tasks, options: WorkerOptions = {}) {
    super(client, options, "worker");
    if (typeof options.queues === "string") {
      throw new TypeError(`queues is a list of queue names, not a string: write queues: ["${options.queues}"]`);
    }
    if (options.timeout !== undefined && !(options.timeout > 0)) {
      throw new TypeError(`timeout must be a positive number of seconds, got ${options.timeout}`);
    }
    if (handler instanceof Tasks) {
      if (handler.size === 0) throw new TypeError("the Tasks registry has no task to run");
      this.tasks = handler;
    } else {
      this.#handler = handler;
    }
    this.queues = options.queues ?? this.tasks?.queues;
    this.concurrency = Math.max(1, options.concurrency ?? 10);
    this.batchSize = Math.max(1, options.batchSize ?? 1);
    this.leaseSeconds = options.leaseSeconds ?? 30;
    this.heartbeatEvery = options.heartbeatEvery ?? Math.max(1, this.leaseSeconds / 3);
    this.pollInterval = options.pollInterval ?? 1;
    this.shutdownGrace = options.shutdownGrace ?? 10;
    this.timeout = options.timeout;
    this.fused = options.fused ?? true;
    this.#maintenance =
      options.maintenance === false
        ? undefined
        : (options.maintenanceInterval ?? Math.min(30, Math.max(1, this.leaseSeconds / 2)));
  }

  /** Attempts this worker holds now. */
  get inFlight(): number {
    return this.#held.size;
  }

  protected async loop(untilIdle: number | undefined): Promise<void> {
    this.#ended = new AbortController();
    const listener =
      this.listenConfig === undefined
        ? undefined
        : new Listener(
            this.listenConfig,
            [`${this.client.schema}_runs`, `${this.client.schema}_cancel`],
            (channel, payload) => this.#notified(channel, payload),
            () => this.wake(),
          );
    const heartbeat = setInterval(() => this.#beat(), this.heartbeatEvery * 1000);
    const maintenance = this.#maintenance === undefined ? undefined : this.#maintain(this.#maintenance);
    try {
      await this.#claimLoop(untilIdle);
    } finally {
      this.stopping = true;
      await this.#shutdown();
      clearInterval(heartbeat);
      this.#ended.abort();
      await maintenance;
      await listener?.close();
    }
  }

  async #claimLoop(untilIdle: number | undefined): Promise<void> {
    let idleSince = performance.now();
    while (!this.stopping) {
      const free = this.concurrency - this.#held.size;
      if (free <= 0) {
        this.#waitingForSlot = true;
        await this.idle(this.pollInterval * 1000);
        this.#waitingForSlot = false;
        continue;
      }
      const want = Math.min(free, this.batchSize);
      let claimed: ClaimedAttempt[] = [];
      try {
        claimed = await this.retried((callId) =>
          this.client.claimAttempts({
            worker: this.name,
            queues: this.queues ? [...this.queues] : null,
            max_runs: want,
            lease_seconds: this.leaseSeconds,
            call_id: callId,
            tasks: this.tasks ? this.tasks.names : null,
          }),
        );
        this.stats.calls += 1;
      } catch (error) {
        this.log.error(`runrelay worker ${this.name}: claim failed: ${String(error)}`);
      }
      if (claimed.length > 0) {
        idleSince = performance.now();
        this.#start(claimed);
        if (claimed.length === want) continue;
      }
      const busy = this.#held.size > 0 || this.#settleCalls > 0;
      if (busy) idleSince = performance.now();
      let wait = this.pollInterval;
      if (untilIdle !== undefined) {
        const left = untilIdle - (performance.now() - idleSince) / 1000;
        if (left <= 0 && !busy) return;
        wait = Math.min(wait, Math.max(0.05, left));
      }
      await this.idle(wait * 1000);
    }
  }

  #notified(channel: string, payload: string): void {
    if (channel.endsWith("_cancel")) {
      try {
        const note = JSON.parse(payload) as { run_id?: string; attempt?: number };
        const held = this.#held.get(`${note.run_id}:${note.attempt}`);
        held?.job.abort(new RunCancelled("cancelled"));
      } catch {
        // Not ours to read.
      }
      return;
    }
    if (this.queues === undefined || this.queues.includes(payload)) this.wake();
  }

  #start(claimed: readonly ClaimedAttempt[]): void {
    this.stats.claimed += claimed.length;
    const claimedAt = performance.now();
    for (const attempt of claimed) {
      const job = new Job(attempt, this.client, this.leaseSeconds);
      const held: Held = { job, claimedAt, settling: false, handedBack: false, beating: false };
      this.#held.set(`${attempt.run_id}:${attempt.attempt}`, held);
      if (this.stopping) {
        // Claimed by a call in flight as the worker stopped: hand it back.
        void this.#handBack([held]);
        continue;
      }
      const running = this.#handle(held).catch((error: unknown) => {
        this.log.error(`runrelay worker ${this.name}: ${attempt.run_id}: ${String(error)}`);
      });
      this.#handlers.add(running);
      void running.finally(() => this.#handlers.delete(running));
    }
  }

  async #handle(held: Held): Promise<void> {
    const outcome = await this.#outcomeOf(held.job);
    if (held.handedBack) return;
    held.settling = true;
    const write = writeFor(held.job, outcome);
    const error = outcome.error;
    if (error instanceof Suspend && error.onWaiting !== undefined) {
      // Its step must run once the run waits, so the suspension is written
      // on its own; the slot stays taken until the step is over.
      const written = await this.#writeAlone(held, write, false);
      if (written === "waiting") await this.#onWaiting(held, error.onWaiting);
      this.#release(held);
      return;
    }
    await this.#settle(held, write);
  }

  /** The handler's outcome, or the reason its signal fired first. */
  async #outcomeOf(job: Job): Promise<{ value?: unknown; error?: unknown }> {
    const task = this.tasks?.get(job.attempt.task);
    const handler = this.tasks ? task?.fn : this.#handler;
    if (handler === undefined) return { error: new UnknownTask(job.attempt.task) };
    const seconds = task?.timeout ?? this.timeout;
    const timer =
      seconds === undefined ? undefined : setTimeout(() => job.abort(new HandlerTimeout(seconds)), seconds * 1000);
    const aborted = new Promise<{ error: unknown }>((resolve) => {
      const fire = (): void => resolve({ error: job.signal.reason });
      if (job.signal.aborted) fire();
      else job.signal.addEventListener("abort", fire, { once: true });
    });
    try {
      return await Promise.race([
        (async () => ({ value: await handler(job as Job<never>) }))().catch((error: unknown) => ({ error })),
        aborted,
      ]);
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
  }

  async #settle(held: Held, write: Write): Promise<void> {
    if (!this.fused || this.stopping) {
      await this.#writeAlone(held, write);
      return;
    }
    await new Promise<void>((done) => {
      this.#queued.push({ held, write, done });
      this.#pump();
    });
  }

  #pump(): void {
    while (this.#queued.length > 0 && this.#settleCalls < SETTLE_CALLS) {
      const wait = this.#gathering();
      if (wait > 0) {
        this.#gatherTimer ??= setTimeout(() => {
          this.#gatherTimer = undefined;
          this.#pump();
        }, wait);
        return;
      }
      const batch = this.#queued.splice(0, Math.max(this.batchSize, this.concurrency));
      this.#settleCalls += 1;
      void this.#settleCall(batch).finally(() => {
        this.#settleCalls -= 1;
        this.#pump();
      });
    }
  }

  /** How much longer, in ms, the next call gathers: until no run claimed
   * less than gatherMs ago is still being handled (0: go now). */
  #gathering(): number {
    const now = performance.now();
    let left = 0;
    for (const held of this.#held.values()) {
      if (!held.settling && !held.handedBack) left = Math.max(left, held.claimedAt + this.gatherMs - now);
    }
    return left;
  }

  async #settleCall(batch: Settlement[]): Promise<void> {
    let rows: SettleAndClaimRow[];
    try {
      rows = await this.retried((callId) =>
        this.client.settleAndClaim({
          items: batch.map((s) => settleItem(s.write)),
          worker: this.name,
          queues: this.queues ? [...this.queues] : null,
          max_runs: this.stopping ? 0 : batch.length,
          lease_seconds: this.leaseSeconds,
          call_id: callId,
          tasks: this.tasks ? this.tasks.names : null,
        }),
      );
      this.stats.calls += 1;
    } catch (error) {
      // A call the server refused as a whole (a result past the payload
      // cap, say): each write on its own, so only its own item fails.
      if (error instanceof RunrelayError) {
        await Promise.all(batch.map((s) => this.#writeAlone(s.held, s.write)));
      } else {
        this.log.error(`runrelay worker ${this.name}: settle_and_claim failed: ${String(error)}`);
        for (const s of batch) this.#release(s.held);
      }
      for (const s of batch) s.done();
      return;
    }
    const claimed: ClaimedAttempt[] = [];
    for (const row of rows) {
      if (row.kind === "settled") this.#count(row.outcome);
      else claimed.push(row as unknown as ClaimedAttempt);
    }
    // The settled jobs' slots pass to the runs the call claimed.
    for (const s of batch) {
      this.#held.delete(this.#key(s.held));
      s.done();
    }
    this.#start(claimed);
    if (this.#waitingForSlot) this.wake();
  }

  /** Write one outcome on its own: its answer, undefined when the write
   * could not be made. `release`: the slot is free afterwards. */
  async #writeAlone(held: Held, write: Write, release = true): Promise<unknown> {
    try {
      let outcome: unknown;
      try {
        outcome = await this.retried(() => this.#call(write));
      } catch (error) {
        if (!(error instanceof RunrelayError) || write.method === "release_attempt") throw error;
        // The write itself was refused (a result past the payload cap):
        // fail the attempt with that error instead, so the run retries.
        outcome = await this.retried(() =>
          this.client.failAttempt({ ...held.job.fence, error: errorOf(error) }),
        );
      }
      this.stats.calls += 1;
      this.#count(outcome as string);
      return outcome;
    } catch (error) {
      this.log.error(`runrelay worker ${this.name}: ${write.method} for ${held.job.runId} failed: ${String(error)}`);
      return undefined;
    } finally {
      if (release) this.#release(held);
    }
  }

  /** A waiting run's on-waiting step. If it throws, the run is failed
   * through the waiting-failure protocol (Client.failWaiting): a signal or
   * timeout that ended the wait first still wins. The run is durably
   * waiting meanwhile: it is neither heartbeaten nor handed back. */
  async #onWaiting(held: Held, step: () => unknown): Promise<void> {
    try {
      await step();
    } catch (error) {
      try {
        const failed = await this.retried(() =>
          this.client.failWaiting({ ...held.job.fence, error: errorOf(error) }),
        );
        this.stats.calls += 2;
        this.#count(failed);
      } catch (failure) {
        this.log.error(`runrelay worker ${this.name}: fail_waiting for ${held.job.runId} failed: ${String(failure)}`);
      }
    }
  }

  #call(write: Write): Promise<unknown> {
    const args = write.args as never;
    switch (write.method) {
      case "complete_attempt":
        return this.client.completeAttempt(args);
      case "fail_attempt":
        return this.client.failAttempt(args);
      case "suspend_attempt":
        return this.client.suspendAttempt(args);
      case "release_attempt":
        return this.client.releaseAttempt(args);
    }
  }

  #count(outcome: string | null): void {
    if (outcome === "completed") this.stats.completed += 1;
    else if (outcome === "failed" || outcome === "retry_scheduled") this.stats.failed += 1;
  }

  #key(held: Held): string {
    return `${held.job.attempt.run_id}:${held.job.attempt.attempt}`;
  }

  #release(held: Held): void {
    this.#held.delete(this.#key(held));
    if (this.#waitingForSlot) this.wake();
  }

  #beat(): void {
    for (const held of this.#held.values()) {
      if (held.settling || held.handedBack || held.beating) continue;
      held.beating = true;
      this.client
        .heartbeat({ ...held.job.fence, lease_seconds: this.leaseSeconds })
        .then((beat) => {
          if (beat !== null && beat.outcome !== "ok") held.job.abort(new RunCancelled(beat.outcome));
        })
        .catch((error: unknown) => this.log.warn(`runrelay worker ${this.name}: heartbeat failed: ${String(error)}`))
        .finally(() => {
          held.beating = false;
        });
    }
  }

  async #maintain(interval: number): Promise<void> {
    while (!this.stopping) {
      await sleep(interval * 1000 * (0.5 + Math.random()), this.#ended.signal);
      if (this.stopping) break;
      try {
        await this.client.reapExpired();
        await this.client.enqueueDueSchedules();
        await this.client.recordQueueActivity();
      } catch (error) {
        this.log.warn(`runrelay worker ${this.name}: maintenance failed: ${String(error)}`);
      }
    }
  }

  async #handBack(helds: Held[]): Promise<void> {
    await Promise.all(
      helds.map(async (held) => {
        held.handedBack = true;
        held.job.abort(new Shutdown());
        await this.#writeAlone(held, releaseWrite(held.job, null, undefined, "WorkerShutdown"));
        this.stats.handedBack += 1;
      }),
    );
  }

  async #shutdown(): Promise<void> {
    const deadline = performance.now() + this.shutdownGrace * 1000;
    while (this.#held.size > 0 && performance.now() < deadline && !this.hurry.signal.aborted) {
      this.#waitingForSlot = true;
      await sleep(Math.min(100, deadline - performance.now()), this.hurry.signal);
    }
    this.#waitingForSlot = false;
    const left = [...this.#held.values()].filter((h) => !h.settling && !h.handedBack);
    if (left.length > 0) {
      this.log.info(`runrelay worker ${this.name}: handing back ${left.length} run(s)`);
      await this.#handBack(left);
    }
    while (this.#settleCalls > 0 || this.#queued.length > 0 || [...this.#held.values()].some((h) => h.settling)) {
      await sleep(20);
    }
  }
}

export type { JsonValue, Logger };
