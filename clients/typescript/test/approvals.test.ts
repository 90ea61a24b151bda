// Approval gates (protocol v3, docs/tools.md "Approvals") against the REAL pipeline, as the docs
// tell a client to use them: clients/run-tests.sh adds a ConversationContext whose `write_file`
// calls under `deploy/` wait for the client's approval. An approved call runs once however often
// its decisions are sent; a denied one never runs and the model reads the message; the handler of
// runTurn decides; a waiting turn refuses new turns and can be cancelled.
// Needs APTIX_TEST_GATED_CONVERSATION_CONTEXT (set by clients/run-tests.sh); skipped without it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { AptixEvent, ApprovalRequired, Client, Schemas, Session, ToolDecision, findSchemasDir } from "../src";

const PREFIX = process.env.APTIX_TEST_PREFIX;
const GATED = process.env.APTIX_TEST_GATED_CONVERSATION_CONTEXT;
const URL = process.env.APTIX_TEST_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const WAIT = { timeoutMs: 90_000 };
const GATED_WRITE = '@call(write_file, {"path": "deploy/run.sh", "content": "echo hi", "mime_type": null})';

function expect<T extends AptixEvent["type"]>(e: AptixEvent, type: T): Extract<AptixEvent, { type: T }> {
  assert.equal(e.type, type, JSON.stringify(e.body));
  return e as Extract<AptixEvent, { type: T }>;
}

async function ask(s: Session, turnId: string): Promise<ApprovalRequired> {
  await s.submitTurn(turnId, `ship it ${GATED_WRITE}`, { fields: { ConversationContextId: GATED } });
  const asked = expect(await s.nextEvent({ ...WAIT, turnId }), "approval_required");
  assert.equal(asked.outcome, "tool_approval_required");
  assert.equal(asked.final, false);
  assert.equal(asked.messageId, `reply:${s.sessionId}:${turnId}:step-0`);
  assert.deepEqual(asked.calls.map((c) => c.name), ["write_file"]);
  assert.ok(!Number.isNaN(Date.parse(asked.expiresAt)), asked.expiresAt);
  return asked;
}

describe("approval gates", { skip: PREFIX && GATED ? false : "no gated context: run clients/run-tests.sh" }, () => {
  let client: Client;
  before(async () => {
    client = await Client.connect({ url: URL, prefix: PREFIX, schemas: new Schemas(findSchemasDir(__dirname)!), strict: true });
  });
  after(() => client.close());

  test("an approved call runs once however often it is approved", async () => {
    const s = await client.openSession();
    const asked = await ask(s, "t1");
    const sub = await s.submitApprovals("t1", [ToolDecision.approve(asked.calls[0])]);
    await s.submitApprovals("t1", [ToolDecision.approve(asked.calls[0])], { messageId: sub.messageId });
    const final = expect(await s.nextEvent({ ...WAIT, turnId: "t1" }), "final");
    assert.deepEqual((final.result.Files ?? []).map((f: { Name: string }) => f.Name), ["run.sh"]);
    await assert.rejects(s.nextEvent({ timeoutMs: 3000 }), /no event/);
  });

  test("a denied call never runs and the model reads why", async () => {
    const s = await client.openSession();
    const asked = await ask(s, "t1");
    await s.submitApprovals("t1", [ToolDecision.deny(asked.calls[0], "not on a Friday")]);
    const final = expect(await s.nextEvent({ ...WAIT, turnId: "t1" }), "final");
    assert.equal(final.result.Files, undefined);
    const [result] = final.result.ToolResults as { ErrorMessage?: string }[];
    assert.match(result.ErrorMessage ?? "", /denied.*not on a Friday/);
  });

  test("runTurn asks the handler, which may deny", async () => {
    const s = await client.openSession();
    const asked: string[] = [];
    const final = await s.runTurn("t1", `ship it ${GATED_WRITE}`, {
      ...WAIT,
      fields: { ConversationContextId: GATED },
      approve: (c) => {
        asked.push(c.name);
        return ToolDecision.deny(c, "ask me on Monday");
      },
    });
    assert.equal(final.type, "final", JSON.stringify(final.body));
    assert.deepEqual(asked, ["write_file"]);
  });

  test("a waiting turn refuses new turns and can be cancelled", async () => {
    const s = await client.openSession();
    const asked = await ask(s, "t1");
    await s.submitTurn("t2", "something else");
    assert.equal(expect(await s.nextEvent({ ...WAIT, turnId: "t2" }), "refused").code, "session.awaiting_approval");
    await s.cancelTurn("t1");
    assert.equal(expect(await s.nextEvent({ ...WAIT, turnId: "t1" }), "failed").code, "turn.cancelled");
    await s.submitApprovals("t1", [ToolDecision.approve(asked.calls[0])]);
    assert.equal(expect(await s.nextEvent({ ...WAIT, turnId: "t1" }), "refused").code, "tool_results.turn_cancelled");
  });
});
