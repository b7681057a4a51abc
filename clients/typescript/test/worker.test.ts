import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import pg from "pg";

import { Client, Retry, Snooze, Suspend, Tasks, Worker, type Job, type Queryable } from "../src/index.js";
import { freshDatabase, LosingProxy, sleep, type TestDatabase, waitFor } from "./helpers.js";

const quiet = { info: () => undefined, warn: () => undefined, error: () => undefined };

/** A Client that records every call it makes and counts its
 * settle_and_claim calls in flight. */
class Recording extends Client {
  readonly sent: { fn: string; args: Record<string, unknown> }[] = [];
  settling = 0;

  protected override async call(fn: string, args: object, conn: Queryable | undefined): Promise<unknown> {
    this.sent.push({ fn, args: args as Record<string, unknown> });
    if (fn !== "settle_and_claim") return super.call(fn, args, conn);
    this.settling += 1;
    try {
      return await super.call(fn, args, conn);
    } finally {
      this.settling -= 1;
    }
  }

  /** The runs each settle_and_claim call settled, in call order. */
  settled(): string[][] {
    return this.sent
      .filter((c) => c.fn === "settle_and_claim" && (c.args["items"] as unknown[]).length > 0)
      .map((c) => (c.args["items"] as { run_id: string }[]).map((i) => i.run_id).sort());
  }
}

describe("the worker", () => {
  let db: TestDatabase;
  let client: Client;

  before(async () => {
    db = await freshDatabase("worker");
    client = db.client;
  });
  after(() => db.close());

  test("runs every run to completion, a write and the next claim in one call", async () => {
    const runs = Array.from({ length: 30 }, (_, i) => ({ run_id: `ok-${i}`, queue: "ok", payload: { i } }));
    await client.enqueueRuns({ items: runs });
    const seen: number[] = [];
    const worker = new Worker(
      client,
      async (job: Job<{ i: number }>) => {
        seen.push(job.payload.i);
        return { double: job.payload.i * 2 };
      },
      { queues: ["ok"], concurrency: 4, logger: quiet },
    );
    await worker.run({ untilIdle: 0.3 });
    assert.equal(seen.length, 30);
    for (let i = 0; i < 30; i++) {
      const run = await client.getRun({ run_id: `ok-${i}` });
      assert.equal(run?.status, "completed");
      assert.deepEqual(run?.result, { double: i * 2 });
      assert.equal(run?.attempt_count, 1);
    }
    assert.equal(worker.stats.completed, 30);
    // 30 jobs: the first claim of each free slot, then settle_and_claim
    // calls that carry the writes and claim the next runs.
    assert.ok(worker.stats.calls < 30 + 8, `calls ${worker.stats.calls}`);
  });

  test("each outcome makes its write: fail and retry, Retry, Suspend, Snooze", async () => {
    await client.enqueueRuns({
      items: [
        { run_id: "boom", queue: "out", payload: { kind: "boom" }, max_attempts: 2 },
        { run_id: "retry", queue: "out", payload: { kind: "retry" } },
        { run_id: "sleep", queue: "out", payload: { kind: "sleep" } },
        { run_id: "snooze", queue: "out", payload: { kind: "snooze" } },
      ],
    });
    const worker = new Worker(
      client,
      (job: Job<{ kind: string }>) => {
        switch (job.payload.kind) {
          case "boom":
            throw new Error("boom");
          case "retry":
            throw new Retry("later", 3600);
          case "sleep":
            throw Suspend.sleep(3600);
          default:
            throw new Snooze(3600, "busy");
        }
      },
      { queues: ["out"], logger: quiet },
    );
    await worker.run({ untilIdle: 0.3 });
    const boom = await client.getRun({ run_id: "boom" });
    // The first failure retries after a backoff: until then it is queued.
    assert.ok(boom?.status === "queued" || boom?.status === "failed");
    assert.equal((boom?.error as { message?: string }).message, "boom");
    const retry = await client.getRun({ run_id: "retry" });
    assert.equal(retry?.status, "queued");
    assert.ok(retry!.run_at.getTime() > Date.now() + 3_000_000);
    assert.equal((await client.getRun({ run_id: "sleep" }))?.status, "waiting");
    const snoozed = await client.getRun({ run_id: "snooze" });
    assert.equal(snoozed?.status, "queued");
    const [attempt] = await client.runAttempts({ run_id: "snooze" });
    assert.equal(attempt?.status, "released", "a snooze does not use an attempt");
  });

  test("a Tasks worker claims only its tasks' runs, and steps survive a retry", async () => {
    const tasks = new Tasks();
    let charged = 0;
    const charge = tasks.define<{ amount: number }>(
      "charge",
      async (job) => {
        const receipt = await job.step("charge-card", () => {
          charged += 1;
          return { paid: job.payload.amount, key: job.stepKey("charge-card") };
        });
        if (job.attempt.attempt === 1) throw new Error("crash after the charge");
        return receipt;
      },
      { queue: "billing" },
    );
    await charge.enqueue(client, { amount: 5 }, { run_id: "charge-1" });
    await client.enqueueRun({ run_id: "other-task", queue: "billing", task: "refund" });
    const worker = new Worker(client, tasks, { logger: quiet });
    assert.deepEqual(worker.queues, ["billing"]);
    // Retry at once: the failure's backoff is moved to now.
    await worker.run({ untilIdle: 0.3 });
    await db.pool.query("UPDATE runrelay.runs SET run_at = now() WHERE run_id = 'charge-1' AND status = 'queued'");
    await worker.run({ untilIdle: 0.3 });
    const run = await client.getRun({ run_id: "charge-1" });
    assert.equal(run?.status, "completed");
    assert.deepEqual(run?.result, { paid: 5, key: "charge-1:charge-card" });
    assert.equal(charged, 1, "the step ran once over two attempts");
    assert.equal((await client.getRun({ run_id: "other-task" }))?.status, "queued");
  });

  test("cancel_run aborts the handler's signal at once, through LISTEN", async () => {
    await client.enqueueRun({ run_id: "cancel-me", queue: "cancel" });
    let aborted: unknown;
    const worker = new Worker(
      client,
      (job) =>
        new Promise((resolve) => {
          job.signal.addEventListener("abort", () => {
            aborted = job.signal.reason;
            resolve("stopped");
          });
        }),
      { queues: ["cancel"], heartbeatEvery: 60, listen: true, logger: quiet },
    );
    const running = worker.run({ untilIdle: 0.5 });
    await waitFor("the claim", async () => worker.inFlight === 1);
    const started = Date.now();
    assert.equal(await client.cancelRun({ run_id: "cancel-me" }), "cancelled");
    await waitFor("the abort", async () => aborted !== undefined, 5_000);
    assert.ok(Date.now() - started < 3_000, "the NOTIFY, not the heartbeat, brought it");
    await running;
    assert.equal(worker.inFlight, 0);
    assert.equal((await client.getRun({ run_id: "cancel-me" }))?.status, "cancelled");
  });

  test("an on-waiting step runs once the run waits; if it throws, the waiting run fails unless a signal came first", async () => {
    await client.enqueueRuns({
      items: [
        { run_id: "ask", queue: "approve", payload: { step: "ok" } },
        { run_id: "ask-fails", queue: "approve", payload: { step: "throws" }, max_attempts: 1 },
        { run_id: "ask-late", queue: "approve", payload: { step: "signalled" }, max_attempts: 1 },
      ],
    });
    const seen: Record<string, string | undefined> = {};
    const worker = new Worker(
      client,
      (job: Job<{ step: string }>) => {
        if (job.resume !== null) return { resumed: job.resume };
        throw Suspend.event("approved", 3600, async () => {
          seen[job.runId] = (await client.getRun({ run_id: job.runId }))?.status;
          if (job.payload.step === "signalled") {
            assert.equal(await client.signalRun({ run_id: job.runId, name: "approved" }), "resumed");
          }
          if (job.payload.step !== "ok") throw new Error("could not ask");
        });
      },
      { queues: ["approve"], logger: quiet },
    );
    await worker.run({ untilIdle: 0.5 });
    assert.deepEqual(seen, { ask: "waiting", "ask-fails": "waiting", "ask-late": "waiting" });
    assert.equal((await client.getRun({ run_id: "ask" }))?.status, "waiting");
    const failed = await client.getRun({ run_id: "ask-fails" });
    assert.equal(failed?.status, "failed");
    assert.equal((failed?.error as { message?: string }).message, "could not ask");
    const late = await client.getRun({ run_id: "ask-late" });
    assert.equal(late?.status, "completed", "the signal won: the failure answered fence_lost");
    assert.deepEqual((late?.result as { resumed?: unknown }).resumed, { name: "approved", payload: {} });
  });

  test("a handler past its timeout fails its attempt with a timeout error", async () => {
    await client.enqueueRun({ run_id: "slow", queue: "slow", max_attempts: 1 });
    const worker = new Worker(client, () => new Promise(() => undefined), {
      queues: ["slow"],
      timeout: 0.2,
      logger: quiet,
    });
    await worker.run({ untilIdle: 0.5 });
    const run = await client.getRun({ run_id: "slow" });
    assert.equal(run?.status, "failed");
    assert.equal((run?.error as { type?: string }).type, "timeout");
  });

  test("listen: true on a client over one connection, not a pool, is refused at construction", async () => {
    const conn = new pg.Client({ connectionString: db.url });
    await conn.connect();
    try {
      assert.throws(
        () => new Worker(new Client(conn), () => undefined, { listen: true, logger: quiet }),
        (error: unknown) => error instanceof TypeError && /listen: true needs a pg\.Pool/.test(error.message),
      );
      // Without listen (the default) the same client makes a worker.
      assert.equal(new Worker(new Client(conn), () => undefined, { logger: quiet }).concurrency, 10);
    } finally {
      await conn.end();
    }
  });

  test("stop() hands unfinished runs back without using an attempt", async () => {
    await client.enqueueRun({ run_id: "held", queue: "shutdown" });
    const worker = new Worker(client, () => new Promise(() => undefined), {
      queues: ["shutdown"],
      shutdownGrace: 0.2,
      logger: quiet,
    });
    const running = worker.run();
    await waitFor("the claim", async () => worker.inFlight === 1);
    worker.stop();
    await running;
    const run = await client.getRun({ run_id: "held" });
    assert.equal(run?.status, "queued");
    const [attempt] = await client.runAttempts({ run_id: "held" });
    assert.equal(attempt?.status, "released");
    assert.equal(worker.stats.handedBack, 1);
  });

  test("a claim whose reply was lost is repeated with its call_id: the same runs, claimed once", async () => {
    const { proxy, url } = await LosingProxy.start(db.url);
    const pool = new pg.Pool({ connectionString: url, max: 4 });
    try {
      const through = new Client(pool);
      await through.enqueueRuns({
        items: [
          { run_id: "lost-1", queue: "lost" },
          { run_id: "lost-2", queue: "lost" },
        ],
      });
      const ran: string[] = [];
      const worker = new Worker(through, (job) => void ran.push(job.runId), {
        queues: ["lost"],
        concurrency: 1,
        maintenance: false,
        logger: quiet,
      });
      proxy.arm("claim_attempts");
      await worker.run({ untilIdle: 0.5 });
      assert.equal(proxy.cuts, 1, "one claim lost its reply");
      // The lost reply's settle then carried lost-1's write; cut one too.
      await through.enqueueRuns({ items: [{ run_id: "lost-3", queue: "lost" }, { run_id: "lost-4", queue: "lost" }] });
      proxy.arm("settle_and_claim");
      await worker.run({ untilIdle: 0.5 });
      assert.equal(proxy.cuts, 2, "one settle_and_claim lost its reply");
      assert.deepEqual(ran.sort(), ["lost-1", "lost-2", "lost-3", "lost-4"]);
      for (const id of ["lost-1", "lost-2", "lost-3", "lost-4"]) {
        const attempts = await client.runAttempts({ run_id: id });
        assert.equal(attempts.length, 1, `${id} was claimed once`);
        assert.equal(attempts[0]?.status, "completed");
      }
    } finally {
      await pool.end();
      await proxy.close();
    }
  });

  /** a1 and a2 finish first, and their settle_and_claim calls (as many as a
   * worker makes at once) wait on their runs' rows, which a session holds;
   * b1 and b2 finish while both calls wait, b2 with `b2Result`. Then the
   * session lets go. Resolves with the recording client once the worker is
   * idle. */
  async function busyCalls(queue: string, b2Result: unknown): Promise<Recording> {
    const ids = ["a1", "a2", "b1", "b2"].map((id) => `${queue}-${id}`);
    // One attempt for b2: a refused result fails its run at once.
    await client.enqueueRuns({ items: ids.map((run_id) => ({ run_id, queue, max_attempts: 1 })) });
    const recording = new Recording(db.pool);
    const locker = await db.pool.connect();
    let locked = false;
    let bDone = 0;
    const control = (async () => {
      try {
        await waitFor("a1 and a2 running", async () => {
          const { rows } = await locker.query(
            "SELECT count(*)::int AS n FROM runrelay.attempts WHERE run_id = ANY($1) AND status = 'running'",
            [ids.slice(0, 2)],
          );
          return rows[0].n === 2;
        });
        await locker.query("BEGIN");
        await locker.query("SELECT 1 FROM runrelay.runs WHERE run_id = ANY($1) FOR UPDATE", [ids.slice(0, 2)]);
        locked = true;
        await waitFor("b1 and b2 finished behind the busy calls", async () => bDone === 2);
        // Their outcomes queue as their handlers return; give that a moment.
        await sleep(100);
        await locker.query("COMMIT");
      } finally {
        locker.release();
      }
    })();
    const worker = new Worker(
      recording,
      async (job) => {
        if (job.runId.endsWith("-a1") || job.runId.endsWith("-a2")) {
          await waitFor("the runs locked", async () => locked, 30_000);
          return { ok: job.runId };
        }
        await waitFor("both calls busy", async () => recording.settling === 2, 30_000);
        bDone += 1;
        return job.runId.endsWith("-b2") ? b2Result : { ok: job.runId };
      },
      { queues: [queue], concurrency: 4, pollInterval: 0.05, maintenance: false, logger: quiet },
    );
    await worker.run({ untilIdle: 0.5 });
    await control;
    return recording;
  }

  async function statuses(queue: string): Promise<Record<string, string>> {
    const { rows } = await db.pool.query(
      "SELECT run_id, status FROM runrelay.runs WHERE queue = $1 ORDER BY run_id",
      [queue],
    );
    return Object.fromEntries(rows.map((r: { run_id: string; status: string }) => [r.run_id.slice(queue.length + 1), r.status]));
  }

  test("outcomes that finish while both settle calls are busy go out together in the next one", async () => {
    const recording = await busyCalls("gc", { ok: "gc-b2" });
    const calls = recording.settled();
    assert.ok(calls.some((c) => c.join() === "gc-b1,gc-b2"), JSON.stringify(calls));
    assert.deepEqual(calls.flat().sort(), ["gc-a1", "gc-a2", "gc-b1", "gc-b2"]);
    assert.deepEqual(await statuses("gc"), { a1: "completed", a2: "completed", b1: "completed", b2: "completed" });
    const { rows } = await db.pool.query("SELECT run_id, result->>'ok' AS ok FROM runrelay.runs WHERE queue = 'gc'");
    for (const row of rows as { run_id: string; ok: string }[]) assert.equal(row.ok, row.run_id);
  });

  /** Runs `names` (run ids `<queue>-<name>`) on a recording worker with a
   * slot each and a gathering window of `gatherMs`: every handler waits
   * until all have started, then for `hold` if given. Resolves with the
   * recording client once the worker is idle. */
  async function startedTogether(
    queue: string,
    names: string[],
    gatherMs: number,
    hold?: (job: Job, recording: Recording) => Promise<unknown>,
  ): Promise<Recording> {
    const ids = names.map((name) => `${queue}-${name}`);
    await client.enqueueRuns({ items: ids.map((run_id) => ({ run_id, queue })) });
    const recording = new Recording(db.pool);
    let started = 0;
    const worker = new Worker(
      recording,
      async (job) => {
        started += 1;
        await waitFor("every handler started", async () => started === ids.length, 30_000);
        await hold?.(job, recording);
        return { ok: job.runId };
      },
      { queues: [queue], concurrency: ids.length, pollInterval: 0.05, maintenance: false, logger: quiet },
    );
    worker.gatherMs = gatherMs;
    await worker.run({ untilIdle: 0.3 });
    return recording;
  }

  test("runs claimed together are settled in one call", async () => {
    // Four runs start and their handlers end at once: the first outcome does
    // not go out alone, the call gathers the others (a long window here, so
    // that the test does not depend on the machine's speed).
    const recording = await startedTogether("gather", ["g0", "g1", "g2", "g3"], 30_000);
    assert.deepEqual(recording.settled(), [["gather-g0", "gather-g1", "gather-g2", "gather-g3"]]);
    assert.deepEqual(await statuses("gather"), { g0: "completed", g1: "completed", g2: "completed", g3: "completed" });
  });

  test("a call does not wait for a handler longer than the gathering window", async () => {
    // slow and quick start together; quick ends at once, slow only once a
    // settle_and_claim call is on its way. Quick's call gathers for the
    // window (200 ms), then goes without slow.
    const recording = await startedTogether("window", ["slow", "quick"], 200, async (job, rec) => {
      if (job.runId.endsWith("-slow")) {
        await waitFor("a call while slow ran", async () => rec.settled().length > 0, 30_000);
      }
    });
    const calls = recording.settled();
    assert.deepEqual(calls[0], ["window-quick"], JSON.stringify(calls));
    assert.ok(calls.slice(1).some((c) => c.join() === "window-slow"), JSON.stringify(calls));
    assert.deepEqual(await statuses("window"), { quick: "completed", slow: "completed" });
  });

  test("an outcome the server refuses does not sink those sent with it", async () => {
    // b2's result is over the payload cap: the shared call of b1 and b2 is
    // refused whole (54000, nothing written), then each is written alone:
    // b1 completes, b2's refused write becomes a failure of its attempt.
    const recording = await busyCalls("refused", { big: "x".repeat(1 << 20) });
    const calls = recording.settled();
    const shared = calls.findIndex((c) => c.join() === "refused-b1,refused-b2");
    assert.ok(shared >= 0, JSON.stringify(calls));
    const after = recording.sent.slice(recording.sent.findIndex(
      (c) => c.fn === "settle_and_claim" && (c.args["items"] as unknown[]).length === 2,
    ) + 1);
    assert.ok(after.some((c) => c.fn === "complete_attempt" && c.args["run_id"] === "refused-b1"));
    assert.deepEqual(await statuses("refused"), { a1: "completed", a2: "completed", b1: "completed", b2: "failed" });
    const [attempt] = await client.runAttempts({ run_id: "refused-b2" });
    assert.equal(attempt?.status, "failed");
    assert.match(JSON.stringify(attempt?.error), /54000|payload/i);
  });

  test("a worker process SIGKILLed mid-job: a second one takes the run once the lease expires", async () => {
    await client.enqueueRun({ run_id: "crash-1", queue: "crash" });
    const script = fileURLToPath(new URL("./fixtures/hanging-worker.js", import.meta.url));
    const child = spawn(process.execPath, [script], {
      env: { ...process.env, RUNRELAY_URL: db.url },
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    await waitFor("the child's claim", async () => out.includes("started crash-1 1"));
    child.kill("SIGKILL");
    await new Promise((resolve) => child.on("exit", resolve));
    const worker = new Worker(client, () => "recovered", {
      queues: ["crash"],
      leaseSeconds: 5,
      maintenanceInterval: 0.5,
      logger: quiet,
    });
    const running = worker.run();
    await waitFor("the recovery", async () => (await client.getRun({ run_id: "crash-1" }))?.status === "completed");
    worker.stop();
    await running;
    const attempts = await client.runAttempts({ run_id: "crash-1" });
    assert.deepEqual(
      attempts.map((a) => [a.attempt, a.worker, a.status]),
      [
        [1, "doomed", "lost"],
        [2, worker.name, "completed"],
      ],
    );
  });
});
