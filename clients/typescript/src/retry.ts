// What the loops share: which errors a repeated call may cure, and sleeping.

import { RunrelayError } from "./errors.js";

/** An error of the connection, not of the call: the call may or may not
 * have committed, so the loops repeat it (with the same call_id, where the
 * function takes one, the repeat answers exactly what the first did). */
export function isConnectionError(error: unknown): boolean {
  if (error instanceof RunrelayError) return false;
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code !== "string") return true; // socket errors, "Connection terminated"
  // connection_exception, admin/crash shutdown, cannot_connect_now,
  // too_many_connections.
  return code.startsWith("08") || code.startsWith("57P") || code === "53300" || code.startsWith("E");
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Backoff before the n-th retry (0-based): 0.2 s doubling to 5 s, ±25 %. */
export function backoff(n: number): number {
  const base = Math.min(5000, 200 * 2 ** n);
  return base * (0.75 + Math.random() * 0.5);
}
