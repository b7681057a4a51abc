export * from "./client.js";
export * from "./errors.js";
export * from "./inputs.js";
export * from "./generated/sqlApi.js";
export { ERROR_TABLE } from "./generated/errors.js";
