// The Relay loop: deliver the run ledger to a sink, each run's lane strictly
// in order. The same semantics as the Python Relay (docs/python-client.md):
//
// `concurrency` delivery slots (default 16) run at once, so several run
// lanes are in flight; a lane is leased to one claim at a time, so two
// slots (or two relays) never hold the same lane. Each pass: discover a run
// with a due head (claim_ledger with batch => true: the batch is frozen at
// its first claim), deliver it, then ack_ledger(claim_next => batchSize)
// acknowledges it and claims the same run's next batch in one round trip.
// With runsPerClaim above 1 (the default, 8) a pass claims the batches of up
// to that many runs in one call (claim_ledger_runs), delivers each run's
// batch in turn, and acknowledges the delivered ones while claiming the
// next runs (ack_ledger_runs): a run's lifecycle lane usually holds a few
// events, and every call is a commit. Batches still waiting for the slot
// WAITING_LIMIT after their claim are handed back (release_ledger), so a
// consumer that hangs on one run holds only that run.
// Transport-only events are acknowledged locally by the claims (kind
// local_ack) and never reach the sink. A slow delivery renews its leases
// (the first renewal scheduled from the claim's lease_remaining_ms); a sink
// error becomes fail_ledger (server-side backoff; blocked when permanent).
// Idle slots sleep until ledger_next_due_at or a <schema>_ledger NOTIFY.
// Claims carry a call_id, so one repeated after a lost reply answers what
// the lost one took. stop() finishes the deliveries in progress and
// acknowledges them; a second stop() aborts them and hands them back
// (release_ledger, no attempt charged).

import type { Client } from "./client.js";
import type { Lane, LedgerEvent } from "./generated/sqlApi.js";
import { type ListenConfig, Listener } from "./listen.js";
import { Loop, type Logger } from "./loop.js";
import { backoff } from "./retry.js";
import { DeliveryError, type Sink } from "./sinks.js";

export interface RelayOptions {
  /** The relay's name in leases and list_processes (default host:pid:random). */
  readonly name?: string;
  /** Lanes to deliver (default both). */
  readonly lanes?: readonly Lane[];
  /** Events per batch (default 100). */
  readonly batchSize?: number;
  /** Lease length in seconds (default 30). */
  readonly leaseSeconds?: number;
  /** Batches in flight at once (default 16). */
  readonly concurrency?: number;
  /** Runs' batches a slot claims and acknowledges per call (1 to 1000,
   * default 8); 1 claims one run per call. */
  readonly runsPerClaim?: number;
  /** Longest idle sleep in seconds (default 5). */
  readonly maxSleep?: number;
  /** LISTEN for wake-ups (new runs, cancellations; ledger work for a
   * relay): a connection string or pg config for its own connection, or
   * true for the pool's settings. Default: none, poll only. */
  readonly listen?: ListenConfig | boolean;
  readonly logger?: Logger;
}

const MESSAGE_CHARS = 2000;
// A lane found empty is asked again after this many ms while the slot's
// other lanes keep it busy.
const EMPTY_LANE_PAUSE = 50;
// How long (ms) the batches of a claim of several runs may wait for the
// slot's deliveries before them, at most a quarter of the lease: past it they
// are handed back for any slot or relay to deliver. A waiting batch is not
// renewed.
const WAITING_LIMIT = 2000;
/** Runs' batches per claim by default: one run per call bounds a relay by
 * the disk's commit flushes, not by its work. */
export const RUNS_PER_CLAIM = 8;

export class Relay extends Loop {
  readonly sink: Sink;
  readonly lanes: readonly Lane[];
  readonly batchSize: number;
  readonly leaseSeconds: number;
  readonly concurrency: number;
  readonly maxSleep: number;
  readonly runsPerClaim: number;
  readonly stats = { batches: 0, delivered: 0, failed: 0, localAcks: 0, renewals: 0, calls: 0 };

  constructor(client: Client, sink: Sink, options: RelayOptions = {}) {
    super(client, options, "relay");
    this.sink = sink;
    this.lanes = options.lanes ?? ["lifecycle", "observability"];
    this.batchSize = Math.max(1, options.batchSize ?? 100);
    this.leaseSeconds = options.leaseSeconds ?? 30;
    this.concurrency = Math.max(1, options.concurrency ?? 16);
    this.maxSleep = options.maxSleep ?? 5;
    const runs = options.runsPerClaim ?? RUNS_PER_CLAIM;
    if (!Number.isInteger(runs) || runs < 1 || runs > 1000) {
      throw new RangeError(`runsPerClaim must be an integer from 1 to 1000, not ${String(runs)}`);
    }
    this.runsPerClaim = runs;
  }

  protected async loop(untilIdle: number | undefined): Promise<void> {
    const listener =
      this.listenConfig === undefined
        ? undefined
        : new Listener(this.listenConfig, [`${this.client.schema}_ledger`], () => this.wake(), () => this.wake());
    const idle = { since: performance.now() };
    try {
      await Promise.all(Array.from({ length: this.concurrency }, (_, i) => this.#slot(i, untilIdle, idle)));
    } finally {
      await listener?.close();
    }
  }

  async #slot(index: number, untilIdle: number | undefined, idle: { since: number }): Promise<void> {
    // Each slot starts on a different lane, so both lanes are asked at once.
    const lanes = [...this.lanes.slice(index % this.lanes.length), ...this.lanes.slice(0, index % this.lanes.length)];
    const emptyUntil = new Map<Lane, number>();
    while (!this.stopping) {
      let progressed = false;
      for (const lane of lanes) {
        if (this.stopping) break;
        if ((emptyUntil.get(lane) ?? 0) > performance.now()) continue;
        try {
          if (await this.#pass(lane)) {
            progressed = true;
            emptyUntil.delete(lane);
          } else {
            emptyUntil.set(lane, performance.now() + EMPTY_LANE_PAUSE);
          }
        } catch (error) {
          this.log.error(`runrelay relay ${this.name}: ${lane}: ${String(error)}`);
          await this.idle(backoff(2));
        }
      }
      if (progressed) {
        idle.since = performance.now();
        continue;
      }
      emptyUntil.clear();
      let wait = this.maxSleep * 1000;
      if (untilIdle !== undefined) {
        // Another slot's progress resets the clock, so the relay returns
        // once no slot delivered anything for untilIdle.
        const left = untilIdle * 1000 - (performance.now() - idle.since);
        if (left <= 0) return;
        wait = Math.min(wait, left);
      }
      if (index === 0) {
        // One slot asks when the next event of its lanes falls due (a
        // retry's backoff); a due head another relay holds is not ours to
        // spin on, hence the floor.
        try {
          const due = await this.client.ledgerNextDueAt({ lane: this.lanes.length === 1 ? this.lanes[0]! : null });
          if (due !== null) wait = Math.min(wait, Math.max(EMPTY_LANE_PAUSE, due.getTime() - Date.now()));
        } catch {
          // The sleep's own bound stands.
        }
      }
      await this.idle(Math.max(EMPTY_LANE_PAUSE, wait));
    }
  }

  /** A relay call, repeated after a lost connection, and counted. */
  async #counted<T>(call: (callId: string) => Promise<T>): Promise<T> {
    const result = await this.retried(call);
    this.stats.calls += 1;
    return result;
  }

  /** One pass on a lane: claim a run's due batch and deliver the run's
   * batches until it has none. Whether anything was done. */
  async #pass(lane: Lane): Promise<boolean> {
    if (this.runsPerClaim > 1) return this.#passRuns(lane);
    let rows = await this.#counted((callId) =>
      this.client.claimLedger({
        relay: this.name,
        lane,
        max_events: this.batchSize,
        lease_seconds: this.leaseSeconds,
        batch: true,
        call_id: callId,
      }),
    );
    let progressed = false;
    for (;;) {
      const claimed = this.#claimed(rows);
      progressed ||= rows.length > 0;
      if (claimed.length === 0) return progressed;
      if (this.hurry.signal.aborted) {
        await this.#release(claimed);
        return progressed;
      }
      const failure = await this.#deliver(lane, claimed);
      if (failure === "aborted") {
        await this.#release(claimed);
        return progressed;
      }
      if (failure !== undefined) {
        await this.#fail(claimed, failure);
        return progressed;
      }
      this.stats.batches += 1;
      this.stats.delivered += claimed.length;
      rows = await this.#counted(() =>
        this.client.ackLedger({
          relay: this.name,
          run_id: claimed[0]!.run_id,
          event_ids: claimed.map((e) => e.event_id),
          claim_next: this.stopping ? 0 : this.batchSize,
          lease_seconds: this.leaseSeconds,
          batch: true,
        }),
      );
      if (this.stopping) {
        await this.#release(rows.filter((r) => r.kind === "claimed"));
        return progressed;
      }
    }
  }

  /** A pass with several runs per call: claim up to runsPerClaim runs'
   * batches, deliver each run's batch in turn, then acknowledge the
   * delivered ones and claim the next runs in one call, until nothing is
   * claimed or EMPTY_LANE_PAUSE has passed (with more than one lane, so the
   * slot looks at its other lanes as often as with one run per claim). A
   * batch the sink refuses is failed and the others go on. */
  async #passRuns(lane: Lane): Promise<boolean> {
    let asked = performance.now();
    const until = asked + EMPTY_LANE_PAUSE;
    let rows = await this.#counted((callId) =>
      this.client.claimLedgerRuns({
        relay: this.name,
        lane,
        max_runs: this.runsPerClaim,
        max_events: this.batchSize,
        lease_seconds: this.leaseSeconds,
        call_id: callId,
      }),
    );
    let progressed = false;
    for (;;) {
      const claimed = this.#claimed(rows);
      progressed ||= rows.length > 0;
      if (claimed.length === 0) return progressed;
      if (this.stopping) {
        await this.#release(claimed);
        return progressed;
      }
      const waiting = new Map<string, LedgerEvent[]>();
      for (const event of claimed) {
        const batch = waiting.get(event.run_id);
        if (batch === undefined) waiting.set(event.run_id, [event]);
        else batch.push(event);
      }
      const sent: LedgerEvent[] = [];
      const released: Promise<void>[] = [];
      const handBack = (): void => {
        const left = [...waiting.values()].flat();
        waiting.clear();
        if (left.length > 0) {
          released.push(
            this.#release(left).catch((error: unknown) =>
              this.log.warn(`runrelay relay ${this.name}: handing back failed: ${String(error)}`),
            ),
          );
        }
      };
      const handBackAt = asked + Math.min(WAITING_LIMIT, (this.leaseSeconds * 1000) / 4);
      const limit = setTimeout(handBack, Math.max(0, handBackAt - performance.now()));
      try {
        for (;;) {
          const next = waiting.entries().next();
          if (next.done === true || this.stopping) break;
          const [runId, events] = next.value;
          waiting.delete(runId);
          const failure = await this.#deliver(lane, events, performance.now() - asked);
          if (failure === "aborted") {
            await this.#release(events);
            break;
          }
          if (failure !== undefined) {
            await this.#fail(events, failure);
            continue;
          }
          this.stats.batches += 1;
          this.stats.delivered += events.length;
          sent.push(...events);
        }
      } finally {
        clearTimeout(limit);
        handBack(); // stopping: never handed to the sink
        await Promise.all(released);
      }
      asked = performance.now();
      const claimRuns = this.stopping || !(this.lanes.length === 1 || asked < until) ? 0 : this.runsPerClaim;
      if (sent.length === 0 && claimRuns === 0) return progressed;
      const out = await this.#counted((callId) =>
        this.client.ackLedgerRuns({
          relay: this.name,
          event_ids: sent.map((e) => e.event_id),
          claim_runs: claimRuns,
          max_events: this.batchSize,
          lease_seconds: this.leaseSeconds,
          lane,
          call_id: callId,
        }),
      );
      rows = out.filter((r) => r.kind !== "delivered");
    }
  }

  /** The claimed rows of a claim's answer, counting its local acks. */
  #claimed(rows: LedgerEvent[]): LedgerEvent[] {
    this.stats.localAcks += rows.filter((r) => r.kind === "local_ack").length;
    return rows.filter((r) => r.kind === "claimed");
  }

  /** Deliver one batch, renewing its leases while the sink takes its time;
   * `waited` ms have passed since its claim. undefined: delivered;
   * "aborted": a second stop() cut it short. */
  async #deliver(lane: Lane, events: LedgerEvent[], waited = 0): Promise<unknown> {
    const ids = events.map((e) => e.event_id);
    const remaining = (events[0]?.lease_remaining_ms ?? this.leaseSeconds * 1000) - waited;
    let renewal: NodeJS.Timeout | undefined;
    const renew = (delay: number): void => {
      renewal = setTimeout(() => {
        this.client
          .renewLedgerLease({ relay: this.name, event_ids: ids, lease_seconds: this.leaseSeconds })
          .then((renewed) => {
            this.stats.renewals += 1;
            if (renewed.length < ids.length) this.log.warn(`runrelay relay ${this.name}: a lease was lost mid-delivery`);
          })
          .catch((error: unknown) => this.log.warn(`runrelay relay ${this.name}: renewal failed: ${String(error)}`));
        renew((this.leaseSeconds * 1000) / 3);
      }, delay);
    };
    renew(Math.max(0, remaining / 2));
    try {
      await this.sink(lane, events, this.hurry.signal);
      return undefined;
    } catch (error) {
      if (this.hurry.signal.aborted) return "aborted";
      return error;
    } finally {
      clearTimeout(renewal);
    }
  }

  async #fail(events: LedgerEvent[], error: unknown): Promise<void> {
    this.stats.failed += 1;
    const delivery = error instanceof DeliveryError ? error : undefined;
    const message = (error instanceof Error ? error.message : String(error)).slice(0, MESSAGE_CHARS);
    this.log.warn(`runrelay relay ${this.name}: delivery of ${events[0]!.run_id} failed: ${message}`);
    await this.#counted(() =>
      this.client.failLedger({
        relay: this.name,
        event_ids: events.map((e) => e.event_id),
        error: {
          type: error instanceof Error ? error.name : typeof error,
          message,
          ...(delivery?.status === undefined ? {} : { status: delivery.status }),
        },
        retry_at: delivery?.retryAt ?? null,
        permanent: delivery?.permanent ?? false,
      }),
    );
  }

  async #release(events: LedgerEvent[]): Promise<void> {
    if (events.length === 0) return;
    await this.#counted(() => this.client.releaseLedger({ relay: this.name, event_ids: events.map((e) => e.event_id) }));
  }
}
