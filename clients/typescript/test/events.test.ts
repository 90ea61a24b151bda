// Typed events from reply-queue messages, and tool results on the wire.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ProtocolError, ToolResult, parseEvent } from "../src";

const S = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
const HEX = "0123456789abcdef01234567";

const headers = (outcome: string, final: boolean, step: number | null = 0, turn = "t1") => {
  const h: Record<string, unknown> = {
    "x-aptix-session-id": S, "x-aptix-turn-id": turn, "x-aptix-kind": "reply", "x-aptix-final": final, "x-aptix-outcome": outcome,
  };
  if (step !== null) h["x-aptix-step"] = step;
  return h;
};
const ok = (result: unknown) => Buffer.from(JSON.stringify({ Successful: true, Result: result, Errors: [], Warnings: [] }));
const err = (errors: unknown[]) => Buffer.from(JSON.stringify({ Successful: false, Result: null, Errors: errors }));
const finalResult = (text = "hello") => ({ SessionId: S, TurnId: "t1", ModeDisplayName: "General", Kind: "final", PrimaryOutputText: text });

test("final", () => {
  const e = parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-1`, headers: headers("final", true, 1), body: ok(finalResult()) });
  assert.equal(e.type, "final");
  if (e.type !== "final") return;
  assert.equal(e.text, "hello");
  assert.equal(e.step, 1);
  assert.equal(e.resent, false);
});

test("tool calls", () => {
  const result = {
    SessionId: S, TurnId: "t1", ModeDisplayName: "General", Kind: "client_tool_continuation",
    ToolCalls: [{ ToolCallId: "c1", Name: "read_file", ArgumentsJson: "{}" }, { ToolCallId: "c2", Name: "run_tests", ArgumentsJson: "{}" }],
  };
  const e = parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-0`, headers: headers("client_tool_continuation", false), body: ok(result) });
  assert.equal(e.type, "tool_calls");
  if (e.type !== "tool_calls") return;
  assert.equal(e.final, false);
  assert.deepEqual(e.calls.map((c) => c.toolCallId), ["c1", "c2"]);
});

test("failed and refused", () => {
  const r = parseEvent({
    type: "reply", messageId: `reply:${S}:t1:conflict-${HEX}`, correlationId: "m1",
    headers: headers("refused", true, null), body: err([{ Code: "turn.conflict", Message: "used", Field: "TurnId" }]),
  });
  assert.equal(r.type, "refused");
  assert.equal(r.type === "refused" && r.code, "turn.conflict");
  assert.equal(r.correlationId, "m1");
  const f = parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-0`, headers: headers("failed", true), body: err([{ Code: "llm.refused", Message: "no" }]) });
  assert.equal(f.type === "failed" && f.code, "llm.refused");
  const noTurn = parseEvent({ type: "reply", messageId: `reply:${S}:-:rejected-${HEX}`, headers: headers("refused", true, null, "-"), body: err([{ Code: "validation.turn_id_invalid", Message: "x" }]) });
  assert.equal(noTurn.turnId, null);
});

test("a failed body names its session and turn", () => {
  const named = Buffer.from(JSON.stringify({
    Successful: false, Result: null, Warnings: [], Errors: [{ Code: "llm.unavailable", Message: "down" }], SessionId: S, TurnId: "t1",
  }));
  const f = parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-0`, headers: headers("failed", true), body: named });
  if (f.type !== "failed") return assert.fail(`not failed: ${f.type}`);
  assert.deepEqual([f.bodySessionId, f.bodyTurnId], [S, "t1"]);
  // Without headers (lenient mode) the body still says whose turn failed.
  const lenient = parseEvent({ type: "reply", messageId: "r1", headers: {}, body: named }, false);
  assert.deepEqual([lenient.type, lenient.sessionId, lenient.turnId], ["failed", S, "t1"]);
  // A body without them (a request naming no valid TurnId, or an older server) reads as before.
  const old = parseEvent({ type: "reply", messageId: `reply:${S}:-:rejected-${HEX}`, headers: headers("refused", true, null, "-"), body: err([{ Code: "validation.turn_id_invalid", Message: "x" }]) });
  if (old.type === "delta") return;
  assert.deepEqual([old.bodySessionId, old.bodyTurnId, old.turnId], [null, null, null]);
});

test("resent replies are recognised", () => {
  const e = parseEvent({ type: "reply", messageId: `reply:${S}:t1:resent-${HEX}`, headers: headers("final", true), body: ok(finalResult()) });
  assert.equal(e.type !== "delta" && e.resent, true);
});

test("delta", () => {
  const e = parseEvent({
    type: "delta", messageId: `delta:${S}:t1:1:4`,
    headers: { "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta", "x-aptix-step": 1, "x-aptix-seq": 4 },
    body: JSON.stringify({ Delta: true, SessionId: S, TurnId: "t1", Step: 1, Seq: 4, Event: { Type: "OutputText", OutputIndex: 0, Text: "Hi" } }),
  });
  assert.equal(e.type, "delta");
  if (e.type !== "delta") return;
  assert.deepEqual([e.step, e.seq, e.text, e.eventType], [1, 4, "Hi", "OutputText"]);
});

test("the body must agree with the outcome", () => {
  assert.throws(() => parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-0`, headers: headers("final", true), body: err([{ Code: "internal.error", Message: "x" }]) }), ProtocolError);
  assert.throws(() => parseEvent({ type: "reply", messageId: `reply:${S}:t1:step-0`, headers: headers("final", false), body: ok(finalResult()) }), /final=false/);
});

test("lenient mode infers from the body", () => {
  const e = parseEvent({ type: "reply", messageId: "r1", headers: { "x-aptix-turn-id": "t1" }, body: ok(finalResult()) }, false);
  assert.equal(e.type, "final");
});

test("tool results on the wire", () => {
  assert.deepEqual(ToolResult.toWire(ToolResult.ok({ toolCallId: "c1", name: "read_file", argumentsJson: "{}" }, { a: 1 }, 5)), {
    ToolCallId: "c1", ExecutionMs: 5, ResultJson: "{\"a\":1}",
  });
  assert.deepEqual(ToolResult.toWire(ToolResult.error("c2", "boom")), { ToolCallId: "c2", ExecutionMs: 0, ErrorMessage: "boom" });
});
