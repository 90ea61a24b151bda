// Schema checks against the repository's schemas/ (examples pass, broken documents fail).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";

import { SchemaError, Schemas, findSchemasDir } from "../src";

const dir = findSchemasDir(__dirname);
const schemas = new Schemas(dir ?? "schemas");
const examples = path.join(path.dirname(dir ?? "."), "examples");

test("examples match the request schema", () => {
  for (const name of ["user-turn.json", "tool-continuation.json"]) {
    schemas.checkRequest(JSON.parse(fs.readFileSync(path.join(examples, name), "utf8")));
  }
});

test("an unknown request property is refused", () => {
  assert.throws(() => schemas.checkRequest({ SessionId: "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f", TurnId: "t", Instruction: "x", Mode: "DDR" }), SchemaError);
});

test("reply schema", () => {
  // Replies always carry Warnings (empty on a failure); the schema requires it.
  schemas.checkReply({ Successful: false, Result: null, Errors: [{ Code: "turn.conflict", Message: "x" }], Warnings: [] });
  assert.throws(
    () => schemas.checkReply({ Successful: false, Result: null, Errors: [{ Code: "turn.conflict", Message: "x" }] }),
    SchemaError,
  );
  assert.throws(() => schemas.checkReply({ Successful: true, Result: { Kind: "final" } }), SchemaError);
  // A reply names its session and turn; each may be absent, never null or malformed.
  const failed = {
    Successful: false, Result: null, Warnings: [], Errors: [{ Code: "llm.unavailable", Message: "x" }],
    SessionId: "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f", TurnId: "t1",
  };
  schemas.checkReply(failed);
  const withoutTurn: Record<string, unknown> = { ...failed };
  delete withoutTurn.TurnId;
  schemas.checkReply(withoutTurn);
  for (const bad of [{ SessionId: null }, { SessionId: "not-a-uuid" }, { TurnId: "t 1" }]) {
    assert.throws(() => schemas.checkReply({ ...failed, ...bad }), SchemaError);
  }
});
