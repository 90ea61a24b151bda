// The README's first example, as printed: it type-checks against the package's own source, and
// (with the real pipeline of clients/run-tests.sh) it runs a turn that calls one of the client's
// tools, sends the result and prints the final answer. Only its URL, prefix and question are
// replaced; the functions it leaves to the reader (`runMyTool`, `mayRun`) are given to it.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as ts from "typescript";

const PKG = path.resolve(__dirname, "..", "..");
const URL = process.env.APTIX_TEST_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const PREFIX = process.env.APTIX_TEST_PREFIX;
const ready = Boolean(PREFIX && process.env.APTIX_TEST_SIM_URL);

/** The README's first `ts` block. */
function example(): string {
  const readme = fs.readFileSync(path.join(PKG, "README.md"), "utf8");
  const block = readme.split("```ts\n")[1]?.split("```")[0];
  assert.ok(block, "README.md has a ts block");
  return block;
}

/** The example as a module importing from `from`: its statements become the body of `main`,
 * which takes what the example leaves to the reader, and a console and stdout of its own. */
function asModule(code: string, from: string): string {
  const lines = code.split("\n");
  const imports = lines.filter((l) => l.startsWith("import "));
  assert.ok(imports.every((l) => l.includes(`from "@aptix/client"`)), imports.join("\n"));
  const at = JSON.stringify(from);
  return [
    ...imports.map((l) => l.replace(`"@aptix/client"`, at)),
    `import type { ToolCall } from ${at};`,
    "export async function main(",
    "  runMyTool: (name: string, args: unknown) => unknown,",
    "  mayRun: (call: ToolCall) => boolean,",
    "  console: { log: (...parts: unknown[]) => void },",
    "  process: { stdout: { write: (text: string) => void } },",
    "): Promise<void> {",
    ...lines.filter((l) => !l.startsWith("import ")),
    "}",
  ].join("\n");
}

function replaced(code: string, pairs: [string, string][]): string {
  for (const [from, to] of pairs) {
    assert.ok(code.includes(from), from);
    code = code.split(from).join(to);
  }
  return code;
}

describe("the README's example", () => {
  test("type-checks against the package", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "aptix-readme-"));
    try {
      const file = path.join(dir, "example.ts");
      fs.writeFileSync(file, asModule(example(), path.join(PKG, "src", "index")));
      const program = ts.createProgram([file], {
        strict: true,
        noEmit: true,
        target: ts.ScriptTarget.ES2022,
        module: ts.ModuleKind.CommonJS,
        moduleResolution: ts.ModuleResolutionKind.Node10,
        esModuleInterop: true,
        skipLibCheck: true,
        types: ["node"],
        typeRoots: [path.join(PKG, "node_modules", "@types")],
      });
      const problems = ts
        .getPreEmitDiagnostics(program)
        .map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n"));
      assert.deepEqual(problems, []);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("runs a tool round trip", { skip: ready ? false : "no pipeline: run clients/run-tests.sh" }, async () => {
    const code = replaced(example(), [
      [`"amqp://guest:guest@127.0.0.1:5672/%2f"`, JSON.stringify(URL)],
      [`prefix: "aptix"`, `prefix: ${JSON.stringify(PREFIX)}`],
      [`"Where is the retry policy?"`, JSON.stringify("tools @call(run_tests)")],
    ]);
    const js = ts.transpileModule(asModule(code, path.join(PKG, "dist", "src", "index")), {
      compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
    }).outputText;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "aptix-readme-"));
    try {
      const file = path.join(dir, "example.js");
      fs.writeFileSync(file, js);
      const ran: string[] = [];
      const printed: string[] = [];
      const { main } = require(file) as { main: (...args: unknown[]) => Promise<void> };
      await main(
        (name: string) => (ran.push(name), { passed: 7 }),
        () => false,
        { log: (...parts: unknown[]) => printed.push(parts.join(" ")) },
        { stdout: { write: (text: string) => printed.push(text) } },
      );
      const out = printed.join("");
      assert.deepEqual(ran, ["run_tests"]);
      assert.ok(out.includes("tool_output ") && out.includes("passed"), out);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
