// The shapes of the JSON arguments the client builds for the batch calls
// (SPEC §3): the fields are the SQL names, as in every other argument.

/** One run of `enqueueRuns`: enqueue_run's arguments, with its defaults. */
export interface EnqueueItem {
  readonly run_id: string;
  readonly queue?: string;
  readonly payload?: unknown;
  /** A Date, or an ISO 8601 string with an offset; absent: now. */
  readonly run_at?: Date | string | null;
  readonly priority?: number;
  readonly max_attempts?: number;
  readonly payload_retention?: "keep" | "drop_on_success";
  readonly concurrency_key?: string | null;
  /** The named task that handles the run (SPEC §3.5); absent: untyped. */
  readonly task?: string | null;
  /** The W3C trace context the run keeps ({traceparent, tracestate?}). */
  readonly trace_context?: Readonly<Record<string, string>> | null;
}

/** One event of `appendEvents` (and of a write's `final_events`). */
export interface AppendEvent {
  readonly type: string;
  readonly payload?: unknown;
  readonly lane?: "ordered" | "observability";
  readonly delivery_key?: string;
  readonly transport_only?: boolean;
}

/** An attempt's fence: the three values every fenced write carries. */
export interface Fence {
  readonly run_id: string;
  readonly attempt: number;
  readonly lease_token: string;
}

/** One item of `completeAttempts`. */
export interface CompleteItem extends Fence {
  readonly result?: unknown;
}

/** One item of `settleAndClaim`: a write, as its own function would take it. */
export type SettleItem =
  | (Fence & {
      readonly op: "complete";
      readonly result?: unknown;
      readonly final_events?: readonly AppendEvent[];
    })
  | (Fence & {
      readonly op: "fail";
      readonly error: unknown;
      readonly retry_at?: string | null;
      readonly final_events?: readonly AppendEvent[];
    })
  | (Fence & {
      readonly op: "suspend";
      readonly wait: unknown;
      readonly final_events?: readonly AppendEvent[];
    })
  | (Fence & {
      readonly op: "release";
      readonly run_at?: string | null;
      readonly reason?: string | null;
    });

/** The fence of a claimed attempt (a claim's row), for its writes:
 * `client.completeAttempt({ ...fenceOf(claimed), result })`. */
export function fenceOf(claimed: {
  readonly run_id: string;
  readonly attempt: number;
  readonly lease_token: string | null;
}): Fence {
  if (claimed.lease_token === null) throw new TypeError("runrelay: a row without a lease has no fence");
  return { run_id: claimed.run_id, attempt: claimed.attempt, lease_token: claimed.lease_token };
}
