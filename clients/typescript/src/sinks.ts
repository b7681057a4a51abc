// Where a Relay delivers: a sink is an async function of (lane, events,
// signal) that resolves once the consumer has the batch, or throws. The
// WebhookSink POSTs each batch, signed the Standard Webhooks way.

import { createHmac } from "node:crypto";

import type { LedgerEvent } from "./generated/sqlApi.js";

export type Sink = (lane: string, events: readonly LedgerEvent[], signal: AbortSignal) => Promise<void>;

/** A failed delivery. `permanent`: retrying cannot help (the relay blocks
 * the lane's head); `retryAt`: when the consumer asked to be retried. */
export class DeliveryError extends Error {
  readonly permanent: boolean;
  readonly status: number | undefined;
  readonly retryAt: Date | undefined;

  constructor(message: string, options: { permanent?: boolean; status?: number; retryAt?: Date } = {}) {
    super(message);
    this.name = "DeliveryError";
    this.permanent = options.permanent ?? false;
    this.status = options.status;
    this.retryAt = options.retryAt;
  }
}

const TRANSIENT_4XX = new Set([408, 409, 425, 429]);
const RETRY_AFTER_STATUSES = new Set([429, 503]);
const RETRY_AFTER_MIN_MS = 1000;
const RETRY_AFTER_MAX_MS = 86_400_000;
const ERROR_BODY_CHARS = 200;
const RESERVED = new Set(["content-type", "idempotency-key", "webhook-id", "webhook-timestamp", "webhook-signature"]);

export function eventJson(event: LedgerEvent): Record<string, unknown> {
  return {
    event_id: event.event_id,
    run_id: event.run_id,
    seq: event.seq,
    type: event.type,
    payload: event.payload,
    delivery_key: event.delivery_key,
    created_at: event.created_at.toISOString(),
  };
}

/** `<first delivery_key>..<last delivery_key>`: the same on every
 * redelivery, because a batch is frozen at its first claim. */
export function batchKey(events: readonly LedgerEvent[]): string {
  return `${events[0]!.delivery_key}..${events[events.length - 1]!.delivery_key}`;
}

/** Printable ASCII stays; everything else (and `%`) is percent-encoded as
 * UTF-8, so any delivery key makes a valid header value. */
export function headerValue(text: string): string {
  let out = "";
  for (const c of text) {
    if (c >= "!" && c <= "~" && c !== "%") out += c;
    else for (const b of Buffer.from(c, "utf8")) out += `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** The HMAC key of a Standard Webhooks secret: base64, with or without the
 * `whsec_` prefix; a Buffer is the key itself. Shorter than 16 bytes: refused. */
export function signingKey(secret: string | Buffer): Buffer {
  let key: Buffer;
  if (typeof secret === "string") {
    const encoded = secret.startsWith("whsec_") ? secret.slice(6) : secret;
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(encoded)) {
      throw new TypeError("secret: a text secret is base64 (whsec_<base64>, as Standard Webhooks gives it)");
    }
    key = Buffer.from(encoded, "base64");
  } else {
    key = secret;
  }
  if (key.length < 16) throw new TypeError(`secret: the key is ${key.length} bytes, at least 16 are needed`);
  return key;
}

/** `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`. */
export function sign(key: Buffer, webhookId: string, timestamp: number, body: string): string {
  return `v1,${createHmac("sha256", key).update(`${webhookId}.${timestamp}.${body}`).digest("base64")}`;
}

/** The moment a Retry-After value names (seconds or an HTTP date), clamped
 * to [now + 1 s, now + 1 day]; undefined when absent or unreadable. */
export function retryAfter(value: string | null, now = Date.now()): Date | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  let at: number;
  if (/^\d+$/.test(text)) at = now + Math.min(Number(text) * 1000, RETRY_AFTER_MAX_MS);
  else {
    at = Date.parse(text);
    if (Number.isNaN(at)) return undefined;
  }
  return new Date(Math.min(Math.max(at, now + RETRY_AFTER_MIN_MS), now + RETRY_AFTER_MAX_MS));
}

function redactedUrl(url: URL): string {
  const shown = new URL(url.toString());
  if (shown.username) shown.username = "***";
  if (shown.password) shown.password = "***";
  if (shown.search) shown.search = "?***";
  return shown.toString();
}

export interface WebhookSinkOptions {
  /** Extra request headers (not the ones the sink sets itself). */
  readonly headers?: Readonly<Record<string, string>>;
  /** A Standard Webhooks secret: each request is signed. */
  readonly secret?: string | Buffer;
  /** Seconds for the whole request, reply read to its end (default 60). */
  readonly deadline?: number;
}

/** POST each batch as JSON: {"lane", "run_id", "events": [...]}. Delivered
 * only on a 2xx whose reply was read to its end. Redirects are never
 * followed (any 3xx is a transient failure); 4xx other than 408, 409, 425
 * and 429 is permanent; the rest is transient, with Retry-After honoured on
 * 429 and 503. */
export function webhookSink(url: string, options: WebhookSinkOptions = {}): Sink {
  const parsed = new URL(url);
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new TypeError(`url must be an http:// or https:// URL, not ${redactedUrl(parsed)}`);
  }
  for (const name of Object.keys(options.headers ?? {})) {
    if (RESERVED.has(name.toLowerCase())) throw new TypeError(`headers: ${name} is set by the sink itself`);
  }
  const key = options.secret === undefined ? undefined : signingKey(options.secret);
  const deadline = (options.deadline ?? 60) * 1000;
  const shown = redactedUrl(parsed);
  return async (lane, events, signal) => {
    if (events.length === 0) return;
    const body = JSON.stringify({ lane, run_id: events[0]!.run_id, events: events.map(eventJson) });
    const id = headerValue(batchKey(events));
    const headers: Record<string, string> = {
      ...options.headers,
      "content-type": "application/json",
      "idempotency-key": id,
    };
    if (key !== undefined) {
      // The id is per batch and the timestamp per attempt: a redelivery is re-signed.
      const stamp = Math.floor(Date.now() / 1000);
      headers["webhook-id"] = id;
      headers["webhook-timestamp"] = String(stamp);
      headers["webhook-signature"] = sign(key, id, stamp, body);
    }
    const where = `POST ${shown}`;
    let status: number;
    let text: string;
    let reply: Response;
    try {
      reply = await fetch(url, {
        method: "POST",
        body,
        headers,
        redirect: "manual",
        signal: AbortSignal.any([signal, AbortSignal.timeout(deadline)]),
      });
      status = reply.status;
      // To the end: a cut-off reply is no receipt.
      text = await reply.text();
    } catch (error) {
      const name = error instanceof Error ? error.name : "Error";
      const why = name === "TimeoutError" ? `timed out (deadline ${deadline / 1000}s)` : `${name}`;
      throw new DeliveryError(`${where}: ${why}`);
    }
    if (status >= 200 && status < 300) return;
    const answer = `${where} answered ${status} ${reply.statusText}`.trimEnd();
    if (status >= 300 && status < 400) {
      throw new DeliveryError(
        `${answer}: redirects are not followed (Location: ${reply.headers.get("location") ?? "none"}); the events were not delivered`,
        { status },
      );
    }
    const detail = text.slice(0, ERROR_BODY_CHARS).trim();
    throw new DeliveryError(`${answer}${detail ? `: ${detail}` : ""}`, {
      permanent: status >= 400 && status < 500 && !TRANSIENT_4XX.has(status),
      status,
      ...(RETRY_AFTER_STATUSES.has(status) ? { retryAt: retryAfter(reply.headers.get("retry-after")) } : {}),
    } as { permanent: boolean; status: number; retryAt?: Date });
  };
}
