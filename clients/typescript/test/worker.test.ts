import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import pg from "pg";

import { Client, Retry, Snooze, Suspend, Tasks, Worker, type Job } from "../src/index.js";
import { freshDatabase, LosingProxy, type TestDatabase, waitFor } from "./helpers.js";

const quiet = { info: () => undefined, warn: () => undefined, error: () => undefined };

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
