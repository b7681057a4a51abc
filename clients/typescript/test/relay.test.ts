import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHmac } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client, type LedgerEvent, Relay, webhookSink } from "../src/index.js";
import { freshDatabase, sleep, type TestDatabase, waitFor } from "./helpers.js";

const quiet = { info: () => undefined, warn: () => undefined, error: () => undefined };
const SECRET = `whsec_${Buffer.from("0123456789abcdef0123456789abcdef").toString("base64")}`;

interface Received {
  headers: http.IncomingHttpHeaders;
  body: string;
  batch: { lane: string; run_id: string; events: { seq: number; type: string; delivery_key: string }[] };
}

/** A real HTTP receiver; `answer` decides each reply. */
async function receiver(
  answer: (r: Received, res: http.ServerResponse) => void | Promise<void> = (_r, res) => void res.end("ok"),
): Promise<{ url: string; received: Received[]; inFlight: { now: number; most: number }; close: () => Promise<void> }> {
  const received: Received[] = [];
  const inFlight = { now: 0, most: 0 };
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      const r = { headers: req.headers, body, batch: JSON.parse(body) as Received["batch"] };
      received.push(r);
      inFlight.now += 1;
      inFlight.most = Math.max(inFlight.most, inFlight.now);
      res.on("close", () => (inFlight.now -= 1));
      void answer(r, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  return {
    url,
    received,
    inFlight,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Runs with `n` observability events each, every lane due now. */
async function runsWithEvents(client: Client, prefix: string, runs: number, n: number): Promise<void> {
  for (let r = 0; r < runs; r++) {
    const run_id = `${prefix}-${r}`;
    await client.enqueueRun({ run_id, queue: prefix });
    await client.appendEvents({
      run_id,
      events: Array.from({ length: n }, (_, i) => ({ type: `e${i}`, lane: "observability" as const, payload: { i } })),
    });
  }
}

function seqsByRun(received: Received[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const r of received) {
    for (const e of r.batch.events) out.set(r.batch.run_id, [...(out.get(r.batch.run_id) ?? []), e.seq]);
  }
  return out;
}

describe("the relay", () => {
  let db: TestDatabase;
  let client: Client;

  before(async () => {
    db = await freshDatabase("relay");
    client = db.client;
  });
  after(() => db.close());

  for (const runsPerClaim of [1, 8]) {
  test(`delivers every run's events in order, signed, several lanes in flight (${runsPerClaim} runs per claim)`, async () => {
    const hooks = await receiver(async (_r, res) => {
      await sleep(100);
      res.end("ok");
    });
    try {
      // Enough runs that the slots' first claims all find some.
      const runs = Math.max(8, 3 * runsPerClaim);
      await runsWithEvents(client, `ord${runsPerClaim}`, runs, 12);
      const relay = new Relay(client, webhookSink(hooks.url, { secret: SECRET }), {
        lanes: ["observability"],
        batchSize: 5,
        concurrency: 8,
        runsPerClaim,
        logger: quiet,
      });
      await relay.run({ untilIdle: 0.5 });
      const seqs = seqsByRun(hooks.received);
      assert.equal(seqs.size, runs);
      for (const [run, list] of seqs) {
        assert.deepEqual(list, [...list].sort((a, b) => a - b), `${run} in order`);
        assert.equal(new Set(list).size, 12, `${run}: each event once`);
      }
      assert.ok(hooks.inFlight.most > 1, `batches in flight at once: ${hooks.inFlight.most}`);
      for (const r of hooks.received) {
        const id = r.headers["webhook-id"] as string;
        const stamp = r.headers["webhook-timestamp"] as string;
        const key = Buffer.from(SECRET.slice(6), "base64");
        const expected = createHmac("sha256", key).update(`${id}.${stamp}.${r.body}`).digest("base64");
        assert.equal(r.headers["webhook-signature"], `v1,${expected}`);
        const events = r.batch.events;
        assert.equal(r.headers["idempotency-key"], `${events[0]!.delivery_key}..${events[events.length - 1]!.delivery_key}`);
      }
    } finally {
      await hooks.close();
    }
  });

  test(`a failed batch is redelivered whole with the same key; a 4xx blocks the head (${runsPerClaim} runs per claim)`, async () => {
    let first = true;
    const flakyRun = `flaky${runsPerClaim}-0`;
    const permRun = `perm${runsPerClaim}-0`;
    const hooks = await receiver((r, res) => {
      if (r.batch.run_id === permRun) {
        res.statusCode = 400;
        return void res.end("no such customer");
      }
      if (first) {
        first = false;
        res.statusCode = 503;
        res.setHeader("Retry-After", "1");
        return void res.end("busy");
      }
      res.end("ok");
    });
    try {
      await runsWithEvents(client, `flaky${runsPerClaim}`, 1, 3);
      await runsWithEvents(client, `perm${runsPerClaim}`, 1, 2);
      const relay = new Relay(client, webhookSink(hooks.url), {
        lanes: ["observability"],
        batchSize: 10,
        concurrency: 1,
        maxSleep: 0.2,
        runsPerClaim,
        logger: quiet,
      });
      await relay.run({ untilIdle: 2.5 });
      const flaky = hooks.received.filter((r) => r.batch.run_id === flakyRun);
      assert.equal(flaky.length, 2, "one failure, one redelivery");
      assert.equal(flaky[0]!.headers["idempotency-key"], flaky[1]!.headers["idempotency-key"]);
      assert.deepEqual(flaky[1]!.batch.events.map((e) => e.seq), flaky[0]!.batch.events.map((e) => e.seq));
      const blocked = await client.listBlockedHeads({ run_id: permRun });
      assert.equal(blocked.length, 1, "the permanent failure blocks the lane's head");
    } finally {
      await hooks.close();
    }
  });
  }

  test("several runs per claim: one sink call per run, several runs acknowledged per call", async () => {
    await runsWithEvents(client, "multi", 20, 3);
    const calls: { runs: Set<string>; seqs: number[] }[] = [];
    const relay = new Relay(
      client,
      async (_lane, events) => void calls.push({ runs: new Set(events.map((e) => e.run_id)), seqs: events.map((e) => e.seq) }),
      { lanes: ["observability"], concurrency: 1, runsPerClaim: 8, maxSleep: 0.2, logger: quiet },
    );
    await relay.run({ untilIdle: 0.3 });
    const mine = calls.filter((c) => [...c.runs][0]!.startsWith("multi-"));
    assert.equal(mine.length, 20, "one sink call per run");
    for (const c of mine) {
      assert.equal(c.runs.size, 1, "a sink call holds one run's batch");
      assert.deepEqual(c.seqs, [2, 3, 4]);
    }
    // One run per call would take a claim and an acknowledgement per run.
    assert.ok(relay.stats.calls <= 10, `calls: ${relay.stats.calls}`);
    const left = await db.pool.query(
      "SELECT count(*)::int AS n FROM runrelay.ledger WHERE run_id LIKE 'multi-%' AND lane = 'observability' AND state <> 'delivered'",
    );
    assert.equal(left.rows[0].n, 0);
  });

  test("a delivery that hangs holds only its run: the batches claimed with it are handed back", async () => {
    await runsWithEvents(client, "hung", 5, 2);
    let hungRun: string | undefined;
    const stuck = new Relay(
      client,
      async (_lane, events, signal) => {
        hungRun = events[0]!.run_id;
        await new Promise((_resolve, reject) => signal.addEventListener("abort", () => reject(new Error("aborted"))));
      },
      // Leases of 20 s: what the other relay gets within 10 s was handed back,
      // not taken over after a lapse.
      { name: "stuck-relay", lanes: ["observability"], concurrency: 1, runsPerClaim: 8, leaseSeconds: 20, logger: quiet },
    );
    const stuckRun = stuck.run();
    await waitFor("the hung delivery", async () => hungRun !== undefined);
    const delivered: string[] = [];
    const other = new Relay(client, async (_lane, events) => void delivered.push(events[0]!.run_id), {
      lanes: ["observability"],
      concurrency: 1,
      runsPerClaim: 8,
      maxSleep: 0.2,
      logger: quiet,
    });
    const otherRun = other.run();
    try {
      // The other four are handed back 2 s after the claim.
      await waitFor("the handed-back runs", async () => delivered.filter((r) => r.startsWith("hung-")).length >= 4, 10_000);
      const hung = delivered.filter((r) => r.startsWith("hung-"));
      assert.equal(new Set(hung).size, 4, "each once");
      assert.ok(!hung.includes(hungRun!), "the hung run stays with its relay");
      const leased = await db.pool.query("SELECT DISTINCT lease_owner FROM runrelay.ledger WHERE run_id = $1 AND state = 'leased'", [hungRun]);
      assert.deepEqual(leased.rows.map((r) => r.lease_owner), ["stuck-relay"]);
    } finally {
      stuck.stop();
      stuck.stop(); // the second ends the grace period: the hung delivery is handed back
      other.stop();
      await Promise.all([stuckRun, otherRun]);
    }
    const left = await db.pool.query("SELECT count(*)::int AS n FROM runrelay.ledger WHERE run_id = $1 AND state = 'leased'", [hungRun]);
    assert.equal(left.rows[0].n, 0, "nothing left leased after the stop");
  });

  test("runsPerClaim outside 1..1000 is refused", () => {
    const sink = async (): Promise<void> => undefined;
    for (const runsPerClaim of [0, 1001, 1.5, Number.NaN]) {
      assert.throws(() => new Relay(client, sink, { runsPerClaim }), RangeError, String(runsPerClaim));
    }
  });

  test("a redirect is not followed and not taken for a delivery; the deadline bounds a trickling reply", async () => {
    let followed = 0;
    const target = await receiver((_r, res) => {
      followed += 1;
      res.end("ok");
    });
    const redirecting = await receiver((_r, res) => {
      res.statusCode = 307;
      res.setHeader("Location", target.url);
      res.end();
    });
    const trickling = await receiver((_r, res) => {
      res.writeHead(200);
      const timer = setInterval(() => res.write("."), 100);
      res.on("close", () => clearInterval(timer));
    });
    try {
      const event = { event_id: 1, run_id: "x", seq: 1, type: "t", payload: {}, delivery_key: "x:1", created_at: new Date() };
      const signal = new AbortController().signal;
      await assert.rejects(webhookSink(redirecting.url)("observability", [event as LedgerEvent], signal), /redirects are not followed/);
      assert.equal(followed, 0);
      const started = Date.now();
      await assert.rejects(webhookSink(trickling.url, { deadline: 0.5 })("observability", [event as LedgerEvent], signal), /timed out/);
      assert.ok(Date.now() - started < 3000);
    } finally {
      await Promise.all([target.close(), redirecting.close(), trickling.close()]);
    }
  });

  test("a relay process SIGKILLed mid-batch: a second relay delivers the same frozen batch, then the rest", async () => {
    await runsWithEvents(client, "crash", 1, 150);
    const script = fileURLToPath(new URL("./fixtures/hanging-relay.js", import.meta.url));
    const child = spawn(process.execPath, [script], {
      env: { ...process.env, RUNRELAY_URL: db.url },
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    await waitFor("the child's delivery", async () => out.includes("delivering crash-0"));
    // seq 1 is the run's run.queued, on the lifecycle lane.
    assert.match(out, /delivering crash-0 2 100/);
    child.kill("SIGKILL");
    await new Promise((resolve) => child.on("exit", resolve));
    const batches: number[][] = [];
    const relay = new Relay(
      client,
      // Other tests' runs may be left in this database: only crash-0 counts.
      async (_lane, events) => void (events[0]!.run_id === "crash-0" && batches.push(events.map((e) => e.seq))),
      { lanes: ["observability"], leaseSeconds: 5, concurrency: 1, maxSleep: 0.5, logger: quiet },
    );
    const running = relay.run();
    await waitFor("the takeover", async () => batches.flat().length >= 150, 30_000);
    relay.stop();
    await running;
    assert.deepEqual(batches[0], Array.from({ length: 100 }, (_, i) => i + 2), "the frozen batch, whole");
    assert.deepEqual(batches.flat(), Array.from({ length: 150 }, (_, i) => i + 2));
  });
});
