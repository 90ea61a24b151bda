// Tenants against the REAL pipeline: two tenants A and B, each a RabbitMQ user with only its own
// tenant's permissions (configure and read `^P\.(session|instance)\.T\..*`, write `^P\.requests$`).
//
// A turn of A ends on A's own queue `<prefix>.session.<A>.<SessionId>`; B, naming A's SessionId
// (a user turn, a duplicate of A's turn, tool results for A's waiting turn), is refused with
// `session.unavailable` on B's own queue `<prefix>.session.<B>.<SessionId>` while A's queue gets
// nothing; B can neither declare nor consume A's queues (403) nor publish as A's user (406); a
// session changes its ConversationContextId (its mode) per turn, while a later turn naming another
// AgentContextId is refused with `session.context_fixed`; a tenant's instance queue is
// `<prefix>.instance.<A>.<I>`.
//
// Skipped unless APTIX_TEST_TENANTS is set. `CLIENTS_TENANTS=1 clients/run-tests.sh PATH/TO/aptix`
// configures the tenants and sets APTIX_TEST_TENANT_A_URL / APTIX_TEST_TENANT_B_URL (their broker
// URLs), APTIX_TEST_TENANT_A / APTIX_TEST_TENANT_B (their names) and
// APTIX_TEST_OTHER_CONVERSATION_CONTEXT (a second ConversationContext tenant A may use, default
// `other`; its first, the one a session is created with here, is `default`).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as amqp from "amqplib";
import { queueExists } from "./stand-in";

import {
  AptixEvent,
  CODE_CONTEXT_FIXED,
  CODE_SESSION_UNAVAILABLE,
  Client,
  LIMIT_CODES,
  Refused,
  Schemas,
  ToolResult,
  findSchemasDir,
  instanceQueue,
  sessionQueue,
  urlUser,
} from "../src";

const ENABLED = Boolean(process.env.APTIX_TEST_TENANTS);
const PREFIX = process.env.APTIX_TEST_PREFIX ?? "";
const ADMIN = process.env.APTIX_TEST_ADMIN_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const A = process.env.APTIX_TEST_TENANT_A ?? "";
const B = process.env.APTIX_TEST_TENANT_B ?? "";
const A_URL = process.env.APTIX_TEST_TENANT_A_URL ?? "";
const B_URL = process.env.APTIX_TEST_TENANT_B_URL ?? "";
const OTHER_CONTEXT = process.env.APTIX_TEST_OTHER_CONVERSATION_CONTEXT || "other";
// A ConversationContext whose money budget any call would pass (docs/tenancy.md §7a).
const SPENT_CONTEXT = process.env.APTIX_TEST_SPENT_CONVERSATION_CONTEXT || "spent";
/** The ConversationContext tenant A's sessions are created with here (the first of its list). */
const FIRST_CONTEXT = "default";
const WAIT = { timeoutMs: 90_000 };

type Conn = Awaited<ReturnType<typeof amqp.connect>>;

if (ENABLED) {
  const missing = ["APTIX_TEST_PREFIX", "APTIX_TEST_TENANT_A", "APTIX_TEST_TENANT_B", "APTIX_TEST_TENANT_A_URL", "APTIX_TEST_TENANT_B_URL"]
    .filter((n) => !process.env[n]);
  if (missing.length > 0) throw new Error(`APTIX_TEST_TENANTS is set but ${missing.join(", ")} is not`);
}

/**
 * `action` on a fresh channel of `conn` fails, and the broker closes that channel with `code`
 * (the channel's "error" event says which; a pending confirm only learns that it closed).
 */
async function closedWith(conn: Conn, code: 403 | 406, action: (ch: amqp.ConfirmChannel) => Promise<unknown>): Promise<void> {
  const ch = await conn.createConfirmChannel();
  const closed = new Promise<Error>((resolve, reject) => {
    ch.on("error", resolve);
    setTimeout(() => reject(new Error(`the channel was not closed with ${code} within 10 s`)), 10_000).unref();
  });
  await assert.rejects(action(ch));
  assert.match(String(await closed), new RegExp(`\\b${code}\\b`));
}

/** `e` is the refusal, with `code`, of the submission `messageId` of `sessionId`. */
function assertRefused(e: AptixEvent, code: string, messageId: string, sessionId: string): Refused {
  assert.equal(e.type, "refused", JSON.stringify(e.body));
  const r = e as Refused;
  assert.equal(r.code, code, JSON.stringify(r.errors));
  assert.equal(r.outcome, "refused");
  assert.equal(r.final, true);
  assert.equal(r.correlationId, messageId);
  assert.equal(r.sessionId, sessionId);
  return r;
}

describe("real pipeline: tenants", { skip: ENABLED ? false : "no tenants: run CLIENTS_TENANTS=1 clients/run-tests.sh" }, () => {
  const schemas = ENABLED ? new Schemas(findSchemasDir(__dirname)!) : undefined;
  let a: Client;
  let b: Client;
  before(async () => {
    a = await Client.connect({ url: A_URL, prefix: PREFIX, tenant: A, schemas, strict: true });
    b = await Client.connect({ url: B_URL, prefix: PREFIX, tenant: B, schemas, strict: true });
  });
  after(async () => {
    await a?.close();
    await b?.close();
  });

  test("a tenant's turn ends on its own session queue", async () => {
    const s = await a.openSession();
    assert.equal(s.queue, sessionQueue(PREFIX, s.sessionId, A));
    assert.equal(s.queue, `${PREFIX}.session.${A}.${s.sessionId}`);
    await s.submitTurn("t1", "hello from tenant a");
    const reply = await s.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(reply.type, "final", JSON.stringify(reply.body));
    if (reply.type !== "final") return;
    assert.equal(reply.messageId, `reply:${s.sessionId}:t1:step-0`);
    assert.ok(reply.text.split("\n").includes("instruction: hello from tenant a"), reply.text);
    await assert.rejects(s.nextEvent({ timeoutMs: 1000 }), /no event/);
    assert.equal(await queueExists(ADMIN, s.queue), true);
    assert.equal(await queueExists(ADMIN, sessionQueue(PREFIX, s.sessionId)), false, "a tenant's session has no queue without the tenant's name");
  });

  test("another tenant is refused the session, on its own queue", async () => {
    const onA = await a.openSession();
    const sid = onA.sessionId;
    await onA.submitTurn("t1", "tools @call(run_tests)");
    const calls = await onA.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body)); // A's turn waits for tool results
    if (calls.type !== "tool_calls") return;

    const onB = await b.openSession(sid);
    assert.equal(onB.queue, `${PREFIX}.session.${B}.${sid}`);

    // Tool results that A's waiting turn would accept, from B.
    let sub = await onB.submitToolResults("t1", calls.calls.map((c) => ToolResult.error(c, "not yours", 1)));
    assertRefused(await onB.nextEvent(WAIT), CODE_SESSION_UNAVAILABLE, sub.messageId, sid);

    await onA.submitToolResults("t1", calls.calls.map((c) => ToolResult.error(c, "no tests matched", 2)));
    const final = await onA.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(final.type === "final" && final.step, 1, JSON.stringify(final.body));

    // A duplicate of A's finished turn (it would get A's stored reply), and a new user turn.
    sub = await onB.submitTurn("t1", "tools @call(run_tests)");
    assertRefused(await onB.nextEvent(WAIT), CODE_SESSION_UNAVAILABLE, sub.messageId, sid);
    sub = await onB.submitTurn("t2", "a turn in someone else's session");
    assertRefused(await onB.nextEvent(WAIT), CODE_SESSION_UNAVAILABLE, sub.messageId, sid);
    await assert.rejects(onB.nextEvent({ timeoutMs: 1000 }), /no event/);

    await assert.rejects(onA.nextEvent({ timeoutMs: 2000 }), /no event/, "A's queue got nothing of B's");
    assert.equal(onA.duplicatesDropped, 0);
    // B's refused t2 left nothing behind: A's own t2 (other content) starts.
    const again = await onA.runTurn("t2", "a's own second turn", WAIT);
    assert.equal(again.type, "final", JSON.stringify(again.body));
    assert.equal(again.messageId, `reply:${sid}:t2:step-0`);
  });

  test("another tenant can neither reach the queues nor publish as its user", async () => {
    const s = await a.openSession(); // A's queue exists
    const conn = await amqp.connect(B_URL);
    try {
      await closedWith(conn, 403, (ch) => ch.assertQueue(s.queue, { durable: true, arguments: {} }));
      await closedWith(conn, 403, (ch) => ch.consume(s.queue, () => undefined, { noAck: false }));
      await closedWith(conn, 403, (ch) => ch.assertQueue(instanceQueue(PREFIX, "pod-1", A), { durable: true, arguments: {} }));
      await closedWith(conn, 403, (ch) => ch.assertQueue(sessionQueue(PREFIX, s.sessionId), { durable: true, arguments: {} }));
      // The broker checks user_id against the connection's user.
      await closedWith(conn, 406, (ch) => new Promise<void>((resolve, reject) => {
        const body = Buffer.from(JSON.stringify({ SessionId: s.sessionId, TurnId: "t1", Instruction: "x" }));
        ch.publish(`${PREFIX}.requests`, s.sessionId, body, {
          contentType: "application/json", deliveryMode: 2, messageId: randomUUID(), userId: urlUser(A_URL), mandatory: true,
        }, (err) => (err ? reject(err) : resolve()));
      }).then(() => ch.waitForConfirms()));
    } finally {
      await conn.close();
    }

    // Through the client: B's user naming tenant A declares A's queue, and is refused.
    const c = await Client.connect({ url: B_URL, prefix: PREFIX, tenant: A });
    try {
      await assert.rejects(c.openSession(s.sessionId), /403/);
    } finally {
      await c.close();
    }
    await assert.rejects(s.nextEvent({ timeoutMs: 1000 }), /no event/);
  });

  test("a session changes its mode per turn and keeps its agent context", async () => {
    const s = await a.openSession();
    const first = await s.runTurn("t1", "first", { ...WAIT, fields: { ConversationContextId: FIRST_CONTEXT } });
    assert.equal(first.type, "final", JSON.stringify(first.body));
    // The mode is the turn's: another ConversationContext of the tenant's, then none (the
    // session's current one), then back.
    const modes: Record<string, unknown>[] = [{ ConversationContextId: OTHER_CONTEXT }, {}, { ConversationContextId: FIRST_CONTEXT }];
    for (const [i, fields] of modes.entries()) {
      const n = i + 2;
      const turn = await s.runTurn(`t${n}`, `turn ${n}`, { ...WAIT, fields });
      assert.equal(turn.type, "final", JSON.stringify(turn.body));
      assert.equal(turn.messageId, `reply:${s.sessionId}:t${n}:step-0`);
    }
    // The AgentContext (endpoint, key, collection) is the session's for good.
    // Another of the tenant's own agent contexts (one it may not use is simply unknown).
    const otherAgent = process.env.APTIX_TEST_OTHER_AGENT_CONTEXT || "alt";
    const sub = await s.submitTurn("t5", "elsewhere", { fields: { AgentContextId: otherAgent } });
    const r = assertRefused(await s.nextEvent({ ...WAIT, turnId: "t5" }), CODE_CONTEXT_FIXED, sub.messageId, s.sessionId);
    assert.equal(r.turnId, "t5");
    // A refusal changes nothing: the session goes on.
    const sixth = await s.runTurn("t6", "sixth", WAIT);
    assert.equal(sixth.type, "final", JSON.stringify(sixth.body));
    assert.equal(sixth.messageId, `reply:${s.sessionId}:t6:step-0`);
  });

  test("a turn over a spent budget fails with a limit code", async () => {
    const s = await a.openSession();
    const reply = await s.runTurn("t1", "spend", { ...WAIT, fields: { ConversationContextId: SPENT_CONTEXT } });
    assert.equal(reply.type, "failed", JSON.stringify(reply.body));
    if (reply.type !== "failed") return;
    assert.equal(reply.code, "limit.budget_exhausted");
    assert.ok((LIMIT_CODES as readonly string[]).includes(reply.code));
    assert.match(reply.errors[0].message, new RegExp(`ConversationContext ${SPENT_CONTEXT}`));
    assert.equal(reply.messageId, `reply:${s.sessionId}:t1:step-0`);
    // Only that call was not made: the session's next turn, in its own mode, runs.
    const again = await s.runTurn("t2", "within budget", { ...WAIT, fields: { ConversationContextId: FIRST_CONTEXT } });
    assert.equal(again.type, "final", JSON.stringify(again.body));
  });

  test("a tenant's instance queue", async () => {
    const name = `ts-${randomUUID().slice(0, 12)}`;
    const c = await Client.connect({ url: A_URL, prefix: PREFIX, tenant: A, instance: name, schemas, strict: true });
    try {
      const queue = c.instance!.queue;
      assert.equal(queue, instanceQueue(PREFIX, name, A));
      assert.equal(queue, `${PREFIX}.instance.${A}.${name}`);
      const s = await c.openSession();
      const sub = await s.submitTurn("t1", "hello from an instance of tenant a");
      assert.equal(sub.replyTo, queue);
      assert.equal(s.replyTo, queue);
      const reply = await s.nextEvent({ ...WAIT, turnId: "t1" });
      assert.equal(reply.type, "final", JSON.stringify(reply.body));
      assert.equal(reply.sessionId, s.sessionId);
      if (reply.type === "final") assert.ok(reply.text.split("\n").includes("instruction: hello from an instance of tenant a"), reply.text);
      for (const q of [sessionQueue(PREFIX, s.sessionId, A), sessionQueue(PREFIX, s.sessionId)]) {
        assert.equal(await queueExists(ADMIN, q), false, `${q} was created`);
      }
    } finally {
      await c.instance?.deleteQueue().catch(() => undefined);
      await c.close();
    }
  });
});
