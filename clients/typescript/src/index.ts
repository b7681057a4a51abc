export * from "./client.js";
export * from "./errors.js";
export * from "./inputs.js";
export * from "./generated/sqlApi.js";
export { ERROR_TABLE } from "./generated/errors.js";
export * from "./job.js";
export * from "./tasks.js";
export { Worker, type WorkerOptions, type Logger, errorOf, writeFor } from "./worker.js";
export type { ListenConfig } from "./listen.js";
