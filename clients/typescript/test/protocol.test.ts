// The message_id grammar and the header checks of protocol v3, without a broker.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  CANCEL_TYPE,
  CODE_CONTEXT_FIXED,
  CODE_REPLY_TO_INVALID,
  CODE_SESSION_UNAVAILABLE,
  CODE_TOOL_RESULTS_TURN_CANCELLED,
  CODE_TURN_CANCELLED,
  CODE_TURN_FINISHED,
  CODE_TURN_NOT_FOUND,
  LIMIT_CODES,
  ProtocolError,
  SUBMISSION_TAGS,
  checkReplyHeaders,
  checkTenantName,
  instanceQueue,
  isInstanceName,
  isTenantName,
  messageSessionId,
  parseMessageId,
  requestsExchange,
  sessionQueue,
  sharedUser,
  urlUser,
} from "../src";

const S = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
const HEX = "0123456789abcdef01234567";

test("names", () => {
  assert.equal(requestsExchange("aptix"), "aptix.requests");
  assert.equal(sessionQueue("t-1", S), `t-1.session.${S}`);
});

test("instance names", () => {
  assert.equal(instanceQueue("aptix", "pod-1"), "aptix.instance.pod-1");
  assert.equal(CODE_REPLY_TO_INVALID, "request.reply_to_invalid");
  for (const good of ["a", "pod-1", "host.example_2", "A".repeat(64), "..", "-_."]) assert.ok(isInstanceName(good), good);
  for (const bad of ["", "A".repeat(65), "a b", "a/b", "a:b", "pod*", "é", "a\n", "\na", "pod-1\n"]) {
    assert.ok(!isInstanceName(bad), JSON.stringify(bad));
  }
});

test("tenant names", () => {
  for (const good of ["a", "0", "t1", "acme-corp", "team_7", "a".repeat(32), "9-_"]) assert.ok(isTenantName(good), good);
  for (const bad of ["", "A", "Acme", "-a", "_a", "a".repeat(33), "a.b", "a b", "a/b", "é", "t1\n", "\nt1", "a:b"]) {
    assert.ok(!isTenantName(bad), JSON.stringify(bad));
    assert.throws(() => checkTenantName(bad), /tenant name/);
  }
});

test("reply queues of a tenant", () => {
  assert.equal(sessionQueue("aptix", S, "t1"), `aptix.session.t1.${S}`);
  assert.equal(sessionQueue("aptix", S, null), `aptix.session.${S}`);
  assert.equal(sessionQueue("aptix", S, undefined), sessionQueue("aptix", S));
  assert.equal(instanceQueue("aptix", "pod-1", "acme-corp"), "aptix.instance.acme-corp.pod-1");
  assert.equal(instanceQueue("aptix", "pod-1", null), "aptix.instance.pod-1");
  for (const bad of ["", "T1", "a.b", "a".repeat(33)]) {
    assert.throws(() => sessionQueue("aptix", S, bad), /tenant name/);
    assert.throws(() => instanceQueue("aptix", "pod-1", bad), /tenant name/);
  }
  assert.deepEqual([CODE_SESSION_UNAVAILABLE, CODE_CONTEXT_FIXED], ["session.unavailable", "session.context_fixed"]);
  assert.deepEqual([...LIMIT_CODES], ["limit.turns_in_flight", "limit.turns_per_minute", "limit.sessions_per_minute", "limit.tokens_per_minute", "limit.budget_exhausted"]);
});

test("the user of a URL", () => {
  assert.equal(urlUser("amqp://guest:guest@127.0.0.1:5672/%2f"), "guest");
  assert.equal(urlUser("amqp://aptix-tenant-a:pw@n1/%2f"), "aptix-tenant-a");
  assert.equal(urlUser("amqp://a%40b%3Ac:p%40ss@n1/%2f"), "a@b:c", "percent-decoded");
  assert.equal(urlUser("amqp://n1:5672/%2f"), "guest", "amqplib's default without credentials");
  assert.throws(() => urlUser("not a url"), /not an AMQP URL/);
  assert.equal(sharedUser(["amqp://u:p@n1/%2f", "amqp://u:q@n2/%2f"]), "u");
  assert.throws(() => sharedUser(["amqp://u:p@n1/%2f", "amqp://v:p@n2/%2f"]), /different users/);
});

test("the session of a message on an instance queue", () => {
  const delta = JSON.stringify({ Delta: true, SessionId: S, TurnId: "t1" });
  const reply = Buffer.from(JSON.stringify({ Successful: true, Result: { SessionId: S, Kind: "final" } }));
  const refusal = JSON.stringify({ Successful: false, Result: null, Errors: [] });
  const other = "00000000-0000-4000-8000-000000000000";
  assert.equal(messageSessionId({ "x-aptix-session-id": other }, delta), other); // the header decides
  assert.equal(messageSessionId({}, delta), S);
  assert.equal(messageSessionId(undefined, reply), S);
  assert.equal(messageSessionId({ "x-aptix-session-id": "" }, refusal), null);
  assert.equal(messageSessionId({ "x-aptix-session-id": 7 }, "not json"), null);
  assert.equal(messageSessionId({}, "[1, 2]"), null);
});

test("step replies, turn ids with colons", () => {
  assert.deepEqual(parseMessageId(`reply:${S}:t1:step-0`), {
    kind: "reply", sessionId: S, turnId: "t1", step: 0, submissionTag: null, fingerprint: null,
  });
  assert.equal((parseMessageId(`reply:${S}:a:b.c:step-12`) as { turnId: string }).turnId, "a:b.c");
});

const TAGS = ["rejected", "rejected-context", "rejected-awaiting", "rejected-continuation", "conflict", "resent", "exhausted", "unavailable", "limited", "rejected-cancel", "rejected-busy", "rejected-follow-up", "rejected-resume"];

test("the submission tags of the grammar", () => {
  assert.deepEqual([...SUBMISSION_TAGS].sort(), [...TAGS].sort());
});

test("cancel type and codes", () => {
  assert.equal(CANCEL_TYPE, "turn.cancel");
  assert.deepEqual(
    [CODE_TURN_CANCELLED, CODE_TURN_FINISHED, CODE_TURN_NOT_FOUND, CODE_TOOL_RESULTS_TURN_CANCELLED],
    ["turn.cancelled", "turn.finished", "turn.not_found", "tool_results.turn_cancelled"],
  );
});

test("submission replies", () => {
  for (const tag of TAGS) {
    assert.deepEqual(parseMessageId(`reply:${S}:t1:${tag}-${HEX}`), {
      kind: "reply", sessionId: S, turnId: "t1", step: null, submissionTag: tag, fingerprint: HEX,
    });
  }
  assert.equal((parseMessageId(`reply:${S}:-:rejected-${HEX}`) as { turnId: null }).turnId, null);
});

test("delta ids", () => {
  assert.deepEqual(parseMessageId(`delta:${S}:x:y:0:3`), { kind: "delta", sessionId: S, turnId: "x:y", step: 0, seq: 3 });
});

test("malformed ids are refused", () => {
  for (const bad of ["", "r1", `reply:${S}:t1`, `reply:${S}:t1:step-x`, `reply:${S}:t1:conflict-123`,
    "reply:not-a-uuid:t1:step-0", `reply:${S}:-:step-0`, `reply:${S}:t 1:step-0`, `delta:${S}:t1:0`,
    `delta:${S}:t1:a:1`, `reply:${S}:t1:unknown-${HEX}`]) {
    assert.throws(() => parseMessageId(bad), ProtocolError, bad);
  }
});

const good = () => ({
  "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "reply",
  "x-aptix-final": true as unknown, "x-aptix-step": 0 as unknown, "x-aptix-outcome": "final" as unknown,
});

test("good headers pass", () => {
  checkReplyHeaders("reply", `reply:${S}:t1:step-0`, good());
  checkReplyHeaders("delta", `delta:${S}:t1:0:3`, {
    "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta", "x-aptix-step": 0, "x-aptix-seq": 3,
  });
});

test("mistyped headers are named", () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ "x-aptix-final": "true" }, /x-aptix-final/],
    [{ "x-aptix-step": "0" }, /x-aptix-step/],
    [{ "x-aptix-outcome": undefined }, /x-aptix-outcome/],
    [{ "x-aptix-kind": "delta" }, /differs/],
    [{ "x-aptix-session-id": "5f0c6f7e-8a1b-4c2d-9e3f-000000000000" }, /another session/],
  ];
  for (const [over, re] of cases) {
    const h: Record<string, unknown> = { ...good(), ...over };
    for (const k of Object.keys(h)) if (h[k] === undefined) delete h[k];
    assert.throws(() => checkReplyHeaders("reply", `reply:${S}:t1:step-0`, h), re);
  }
  assert.throws(() => checkReplyHeaders("delta", `delta:${S}:t1:0:10`, {
    "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta", "x-aptix-step": 0, "x-aptix-seq": "10",
  }), /x-aptix-seq/);
});
