// A LISTEN session for the loops: its own connection (a pooled one would be
// handed to other work), reconnected with backoff after it is lost. A
// session that (re)connects reports a wake-up once, since a NOTIFY sent
// while no session listened is gone.

import pg from "pg";

import { backoff, sleep } from "./retry.js";

export type ListenConfig = string | pg.ClientConfig;

export class Listener {
  readonly #config: ListenConfig;
  readonly #channels: readonly string[];
  readonly #onNotify: (channel: string, payload: string) => void;
  readonly #onConnected: () => void;
  #client: pg.Client | undefined;
  #closed = false;
  readonly #stop = new AbortController();
  #failures = 0;
  readonly done: Promise<void>;

  constructor(
    config: ListenConfig,
    channels: readonly string[],
    onNotify: (channel: string, payload: string) => void,
    onConnected: () => void,
  ) {
    this.#config = config;
    this.#channels = channels;
    this.#onNotify = onNotify;
    this.#onConnected = onConnected;
    this.done = this.#keep();
  }

  async #keep(): Promise<void> {
    while (!this.#closed) {
      const client = new pg.Client(
        typeof this.#config === "string" ? { connectionString: this.#config } : this.#config,
      );
      const lost = new Promise<void>((resolve) => {
        client.on("error", () => resolve());
        client.on("end", () => resolve());
      });
      try {
        await client.connect();
        client.on("notification", (n) => this.#onNotify(n.channel, n.payload ?? ""));
        for (const channel of this.#channels) {
          await client.query(`LISTEN "${channel.replaceAll('"', '""')}"`);
        }
        this.#client = client;
        this.#failures = 0;
        this.#onConnected();
        await Promise.race([lost, sleepUntilAborted(this.#stop.signal)]);
      } catch {
        // Refused or lost while connecting: try again after the backoff.
      }
      this.#client = undefined;
      await client.end().catch(() => undefined);
      if (!this.#closed) await sleep(backoff(this.#failures++), this.#stop.signal);
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#stop.abort();
    await this.done;
  }
}

function sleepUntilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}
