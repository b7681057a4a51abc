// The examples of docs/typescript-client.md type-check against this package:
// each ```ts block is compiled (strict, as a user's module importing
// "runrelay") with tsc, so an example cannot call a method or pass an
// argument the client does not have.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const docs = resolve(root, "..", "..", "docs", "typescript-client.md");

test("the examples of docs/typescript-client.md type-check", () => {
  const blocks = [...readFileSync(docs, "utf8").matchAll(/```ts\n(.*?)```/gs)].map((m) => m[1]!);
  assert.ok(blocks.length >= 3, "the page has its examples");
  const dir = join(root, "build", "docs-check");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  blocks.forEach((block, i) => writeFileSync(join(dir, `example${i}.ts`), block));
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "NodeNext",
        moduleResolution: "NodeNext",
        strict: true,
        noEmit: true,
        skipLibCheck: true,
        types: ["node"],
        typeRoots: [join(root, "node_modules", "@types")],
        baseUrl: ".",
        paths: { runrelay: [join(root, "src", "index.ts")], pg: [join(root, "node_modules", "@types", "pg")] },
      },
      include: ["*.ts"],
    }),
  );
  writeFileSync(join(dir, "package.json"), JSON.stringify({ type: "module" }));
  try {
    execFileSync(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", dir], {
      encoding: "utf8",
      stdio: "pipe",
    });
  } catch (error) {
    assert.fail(`tsc on the examples:\n${(error as { stdout?: string }).stdout ?? String(error)}`);
  }
});
