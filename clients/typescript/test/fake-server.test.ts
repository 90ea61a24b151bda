// The client's AMQP side against the real RabbitMQ, with a small fake server in the same process
// playing the pipeline's part of protocol v3. `@stream` adds three deltas before the final
// reply, `@dup` publishes the reply twice under one message_id, `@badheader` sends
// `x-aptix-final` as a string, `@hold` sends nothing until `finish(turn)`, `@refuse` refuses the
// submission (`turn.conflict`, the turn going on), `@busy` refuses it with `session.busy` (nothing
// stored). A `turn.resume` is answered with a `resumed`
// notice, or refused (`turn.not_found`) while `refuseResumes` is set. A request whose `reply_to` names an instance queue (§4a) is
// answered there, through the replies exchange with routing key `instance.<I>`, and the fake then
// declares no session queue. Tenants: `fake.tenants` maps a request's `user_id` (as the broker
// checked it) to a tenant `T`, whose session replies go to `<prefix>.session.T.<SessionId>`.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as amqp from "amqplib";
import { declareStandIn, queueExists } from "./stand-in";
import { until } from "./support";

import { CANCEL_TYPE, Client, PublishError, Schemas, ToolResult, WireMessage, findSchemasDir, sessionQueue, urlUser } from "../src";

const ADMIN = process.env.APTIX_TEST_ADMIN_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const schemas = new Schemas(findSchemasDir(__dirname) ?? "schemas");

type Conn = Awaited<ReturnType<typeof amqp.connect>>;

class FakeServer {
  readonly prefix = `tsc-${randomUUID().slice(0, 12)}`;
  readonly requests: amqp.ConsumeMessage[] = [];
  /** user_id -> tenant, for replies to a tenant's session queue. */
  readonly tenants = new Map<string, string>();
  readonly queues = new Set<string>();
  /** Answer a turn.resume with a refusal (turn.not_found) instead of a notice. */
  refuseResumes = false;
  /** Turns sent with @hold: TurnId -> [routing key, SessionId]. */
  readonly held = new Map<string, [string, string]>();
  conn!: Conn;
  ch!: amqp.ConfirmChannel;

  async start(): Promise<void> {
    this.conn = await amqp.connect(ADMIN);
    const ch = (this.ch = await this.conn.createConfirmChannel());
    const ingress = await declareStandIn(ch, this.prefix);
    await ch.consume(ingress, (m) => m && void this.answer(m));
  }

  private publish(key: string, id: string, type: string, headers: Record<string, unknown>, body: unknown): void {
    this.ch.publish(`${this.prefix}.replies`, key, Buffer.from(JSON.stringify(body)), {
      type, messageId: id, contentType: "application/json", deliveryMode: 2, headers, mandatory: true,
    });
  }

  private refusal(key: string, s: string, t: string, tag: string, code: string, correlationId: string): void {
    const headers = { "x-aptix-session-id": s, "x-aptix-turn-id": t, "x-aptix-kind": "reply", "x-aptix-final": true, "x-aptix-outcome": "refused" };
    const body = { Successful: false, Result: null, Warnings: [], SessionId: s, TurnId: t, Errors: [{ Code: code, Message: `refused by the fake: ${code}` }] };
    this.ch.publish(`${this.prefix}.replies`, key, Buffer.from(JSON.stringify(body)), {
      type: "reply", messageId: `reply:${s}:${t}:${tag}-${randomUUID().replace(/-/g, "").slice(0, 24)}`,
      correlationId, contentType: "application/json", deliveryMode: 2, headers, mandatory: true,
    });
  }

  /** Answers a turn sent with @hold. */
  async finish(turn: string): Promise<void> {
    await until(() => this.held.has(turn));
    const [key, s] = this.held.get(turn)!;
    this.held.delete(turn);
    const headers = { "x-aptix-session-id": s, "x-aptix-turn-id": turn, "x-aptix-kind": "reply", "x-aptix-final": true, "x-aptix-step": 0, "x-aptix-outcome": "final" };
    const body = { Successful: true, Errors: [], Warnings: [], Result: { SessionId: s, TurnId: turn, ModeDisplayName: "General", Kind: "final", PrimaryOutputText: `echo: finished ${turn}` } };
    this.publish(key, `reply:${s}:${turn}:step-0`, "reply", headers, body);
    await this.ch.waitForConfirms();
  }

  private resume(m: amqp.ConsumeMessage, key: string, s: string, t: string, after: unknown): void {
    const correlationId = String(m.properties.messageId);
    if (this.refuseResumes) {
      this.refusal(key, s, t, "rejected-resume", "turn.not_found", correlationId);
      return;
    }
    const notice = { Resumed: true, SessionId: s, TurnId: t, AfterSeq: after ?? null, UpToSeq: null, Ended: false };
    this.ch.publish(`${this.prefix}.replies`, key, Buffer.from(JSON.stringify(notice)), {
      type: "resumed", messageId: `resumed:${s}:${t}:resumed-${randomUUID().replace(/-/g, "").slice(0, 24)}`,
      correlationId, contentType: "application/json", deliveryMode: 2, headers: { "x-aptix-session-id": s, "x-aptix-turn-id": t }, mandatory: true,
    });
  }

  private async answer(m: amqp.ConsumeMessage): Promise<void> {
    this.requests.push(m);
    const req = JSON.parse(m.content.toString());
    const [s, t, text] = [req.SessionId as string, req.TurnId as string, (req.Instruction ?? "") as string];
    const replyTo = m.properties.replyTo ? String(m.properties.replyTo) : "";
    const instancePrefix = `${this.prefix}.instance.`;
    let key = s;
    if (replyTo.startsWith(instancePrefix)) {
      // The server only binds an instance queue (the client declared it).
      key = `instance.${replyTo.slice(instancePrefix.length)}`;
      await this.ch.bindQueue(replyTo, `${this.prefix}.replies`, key);
    } else {
      const tenant = this.tenants.get(String(m.properties.userId ?? ""));
      const q = sessionQueue(this.prefix, s, tenant);
      if (tenant !== undefined) key = `${tenant}.${s}`; // as the server binds them
      await this.ch.assertQueue(q, { durable: true, arguments: {} });
      await this.ch.bindQueue(q, `${this.prefix}.replies`, key);
      this.queues.add(q);
    }
    const common = { "x-aptix-session-id": s, "x-aptix-turn-id": t };
    if (text.includes("@busy") || text.includes("@attached")) {
      // @attached: the request was a copy of a running turn's, refused as an attach past the
      // resume limit (the turn goes on).
      const busy = text.includes("@busy");
      this.refusal(key, s, t, busy ? "rejected-busy" : "rejected-resume", busy ? "session.busy" : "limit.resumes_per_minute", String(m.properties.messageId));
      await this.ch.waitForConfirms();
      this.ch.ack(m);
      return;
    }
    if (m.properties.type === "turn.resume" || text.includes("@hold") || text.includes("@refuse")) {
      if (m.properties.type === "turn.resume") this.resume(m, key, s, t, req.AfterSeq);
      else this.held.set(t, [key, s]);
      if (text.includes("@refuse")) this.refusal(key, s, t, "conflict", "turn.conflict", String(m.properties.messageId));
      await this.ch.waitForConfirms();
      this.ch.ack(m);
      return;
    }
    let answer = "";
    if (text.includes("@stream")) {
      ["a", "b", "c"].forEach((piece, seq) => {
        answer += piece;
        this.publish(key, `delta:${s}:${t}:0:${seq}`, "delta", { ...common, "x-aptix-kind": "delta", "x-aptix-step": 0, "x-aptix-seq": seq },
          { Delta: true, SessionId: s, TurnId: t, Step: 0, Seq: seq, Event: { Type: "OutputText", OutputIndex: 0, Text: piece } });
      });
    }
    const headers = { ...common, "x-aptix-kind": "reply", "x-aptix-final": text.includes("@badheader") ? "true" : true, "x-aptix-step": 0, "x-aptix-outcome": "final" };
    const body = { Successful: true, Errors: [], Warnings: [], Result: { SessionId: s, TurnId: t, ModeDisplayName: "General", Kind: "final", PrimaryOutputText: answer || `echo: ${text}` } };
    for (let i = 0; i < (text.includes("@dup") ? 2 : 1); i++) this.publish(key, `reply:${s}:${t}:step-0`, "reply", headers, body);
    await this.ch.waitForConfirms();
    this.ch.ack(m);
  }

  async stop(): Promise<void> {
    for (const q of this.queues) await this.ch.deleteQueue(q);
    for (const q of new Set(this.requests.map((m) => m.properties.replyTo).filter(Boolean))) await this.ch.deleteQueue(String(q));
    await this.ch.deleteQueue(`${this.prefix}.requests`);
    for (const x of ["requests", "replies"]) await this.ch.deleteExchange(`${this.prefix}.${x}`);
    await this.conn.close();
  }
}

const fake = new FakeServer();
before(() => fake.start());
after(() => fake.stop());

/** A wire log's messages sent and received. Read by direction, not position: a reply can be
 *  delivered before its request's publish confirm, and a request is logged once confirmed. */
function byDirection(wire: [string, WireMessage][]): [WireMessage[], WireMessage[]] {
  const of = (dir: string) => wire.filter(([d]) => d === dir).map(([, m]) => m);
  return [of("out"), of("in")];
}

test("a turn on the wire", async () => {
  const wire: [string, WireMessage][] = [];
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, schemas, wireLog: (d, m) => wire.push([d, m]) });
  const s = await c.openSession();
  const sub = await s.submitTurn("t1", "hello");
  const reply = await s.nextEvent({ timeoutMs: 10_000 });
  await c.close();
  assert.equal(reply.type, "final");
  assert.equal(reply.type === "final" && reply.text, "echo: hello");
  const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
  assert.ok(req);
  assert.equal(req.fields.routingKey, s.sessionId);
  assert.equal(req.fields.exchange, `${fake.prefix}.requests`);
  assert.equal(req.properties.deliveryMode, 2);
  assert.equal(req.properties.contentType, "application/json");
  assert.equal(req.properties.userId, urlUser(ADMIN), "userId: the URL's user, as the broker checked it");
  assert.equal(c.userId, urlUser(ADMIN));
  assert.deepEqual(JSON.parse(req.content.toString()), { SessionId: s.sessionId, TurnId: "t1", Instruction: "hello" });
  const [sent, received] = byDirection(wire);
  assert.equal(sent.length, 1);
  assert.equal(sent[0].properties.user_id, urlUser(ADMIN));
  assert.equal(received.length, 1);
  assert.equal(received[0].headers["x-aptix-final"], true);
});

test("fresh message ids and traceparent", async () => {
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  const s = await c.openSession();
  const a = await s.submitTurn("t1", "one", { traceparent: tp });
  const b = await s.submitTurn("t2", "two");
  await s.nextEvent({ timeoutMs: 10_000 });
  await s.nextEvent({ timeoutMs: 10_000 });
  await c.close();
  assert.notEqual(a.messageId, b.messageId);
  const req = fake.requests.find((m) => m.properties.messageId === a.messageId);
  assert.deepEqual(req?.properties.headers, { traceparent: tp });
});

test("deltas in order, then the final reply", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, schemas });
  const s = await c.openSession();
  await s.submitTurn("t1", "@stream", { stream: true });
  const events = [];
  for await (const e of s.turnEvents("t1", { timeoutMs: 10_000 })) events.push(e);
  await c.close();
  const deltas = events.flatMap((e) => (e.type === "delta" ? [e] : []));
  assert.deepEqual(deltas.map((d) => d.seq), [0, 1, 2]);
  const last = events[events.length - 1];
  assert.equal(last.type === "final" && last.text, deltas.map((d) => d.text).join(""));
});

test("duplicates are dropped by message_id; one turn's events can be read first", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  const s = await c.openSession();
  await s.submitTurn("t1", "@dup");
  await s.submitTurn("t2", "after");
  assert.equal((await s.nextEvent({ timeoutMs: 10_000, turnId: "t2" })).turnId, "t2");
  assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
  await assert.rejects(s.nextEvent({ timeoutMs: 300 }), /no event/);
  assert.equal(s.duplicatesDropped, 1);
  await c.close();
});

test("mistyped headers are an error", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  const s = await c.openSession();
  await s.submitTurn("t1", "@badheader");
  await assert.rejects(s.nextEvent({ timeoutMs: 10_000 }), /x-aptix-final/);
  await c.close();
});

test("an unroutable request is an error", async () => {
  const prefix = `tsc-${randomUUID().slice(0, 12)}`;
  const admin = await amqp.connect(ADMIN);
  const ch = await admin.createChannel();
  await ch.assertExchange(`${prefix}.requests`, "topic", { durable: true }); // nothing bound behind it
  try {
    const c = await Client.connect({ url: ADMIN, prefix });
    const s = await c.openSession();
    await assert.rejects(s.submitTurn("t1", "lost"), PublishError);
    await s.deleteQueue();
    await c.close();
  } finally {
    await ch.deleteExchange(`${prefix}.requests`);
    await admin.close();
  }
});

test("tool results go in the order of the calls", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  const s = await c.openSession();
  s.pendingCalls.set("t1", ["c1", "c2"]); // as if a tool_calls for t1 had asked for c1 then c2
  await assert.rejects(s.submitToolResults("t1", [ToolResult.ok("c1", 1)]), /waits for results/);
  const sub = await s.submitToolResults("t1", [ToolResult.ok("c2", 2), ToolResult.ok("c1", 1)]);
  assert.deepEqual((sub.body as { ToolResults: { ToolCallId: string }[] }).ToolResults.map((r) => r.ToolCallId), ["c1", "c2"]);
  await s.nextEvent({ timeoutMs: 10_000 });
  await c.close();
});

test("a cancel on the wire", async () => {
  // §7a: the cancel goes where requests go, with `type` = `turn.cancel` and the body
  // {"SessionId", "TurnId"}, which is no AGN-034 request: the request schema is not applied.
  const wire: [string, WireMessage][] = [];
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, schemas, wireLog: (d, m) => wire.push([d, m]) });
  const s = await c.openSession();
  const turn = await s.submitTurn("t1", "hello");
  const sub = await s.cancelTurn("t1", { messageId: `cancel-${randomUUID()}` });
  await s.nextEvent({ timeoutMs: 10_000 }); // the fake answers both with reply:S:t1:step-0: the second is a copy
  for (let i = 0; i < 100 && !fake.requests.some((m) => m.properties.messageId === sub.messageId); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await c.close();
  assert.equal(sub.type, CANCEL_TYPE);
  assert.equal(turn.type, null);
  assert.equal(sub.turnId, "t1");
  assert.deepEqual(sub.body, { SessionId: s.sessionId, TurnId: "t1" });
  const t = fake.requests.find((m) => m.properties.messageId === turn.messageId);
  assert.equal(t?.properties.type, undefined, "a request carries no type");
  const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
  assert.ok(req);
  assert.equal(req.properties.type, "turn.cancel");
  assert.equal(req.fields.routingKey, s.sessionId);
  assert.equal(req.fields.exchange, `${fake.prefix}.requests`);
  assert.equal(req.properties.deliveryMode, 2);
  assert.equal(req.properties.contentType, "application/json");
  assert.equal(req.properties.userId, c.userId);
  assert.deepEqual(JSON.parse(req.content.toString()), { SessionId: s.sessionId, TurnId: "t1" });
  const out = wire.filter(([d]) => d === "out").map(([, m]) => m);
  assert.equal(out[1].properties.type, "turn.cancel");
});

// --- replies per instance (§4a) ---------------------------------------------------------------

test("an instance turn on the wire", async () => {
  const wire: [string, WireMessage][] = [];
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, instance: "pod-1", schemas, wireLog: (d, m) => wire.push([d, m]) });
  const queue = `${fake.prefix}.instance.pod-1`;
  assert.equal(c.instance?.queue, queue);
  const s = await c.openSession();
  const sub = await s.submitTurn("t1", "hello");
  const reply = await s.nextEvent({ timeoutMs: 10_000 });
  assert.equal(await queueExists(ADMIN, sessionQueue(fake.prefix, s.sessionId)), false);
  await c.close();
  assert.equal(reply.type === "final" && reply.text, "echo: hello");
  assert.equal(reply.sessionId, s.sessionId);
  const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
  assert.ok(req);
  assert.equal(req.fields.routingKey, s.sessionId);
  assert.equal(req.properties.replyTo, queue);
  assert.equal(sub.replyTo, queue);
  const [sent, received] = byDirection(wire);
  assert.equal(sent.length, 1);
  assert.equal(sent[0].properties.reply_to, queue);
  assert.equal(received.length, 1);
  assert.equal(received[0].queue, queue);
});

test("many sessions share one instance queue", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, instance: "pod-2" });
  const sessions = await Promise.all(Array.from({ length: 5 }, () => c.openSession()));
  for (let turn = 0; turn < 3; turn++) {
    await Promise.all(sessions.map((s) => s.submitTurn(`t${turn}`, turn === 1 ? "@stream" : `q${turn}`, { stream: turn === 1 })));
  }
  await Promise.all(
    sessions.map(async (s) => {
      const events = [];
      for (let i = 0; i < 6; i++) events.push(await s.nextEvent({ timeoutMs: 10_000 })); // t0, 3 deltas of t1, t1, t2
      assert.deepEqual(events.filter((e) => e.type === "final").map((e) => e.turnId), ["t0", "t1", "t2"]);
      assert.ok(events.every((e) => e.sessionId === s.sessionId));
      assert.equal(await queueExists(ADMIN, sessionQueue(fake.prefix, s.sessionId)), false);
    }),
  );
  await c.close();
  const replyTos = new Set(fake.requests.filter((m) => sessions.some((s) => m.fields.routingKey === s.sessionId)).map((m) => m.properties.replyTo));
  assert.deepEqual([...replyTos], [`${fake.prefix}.instance.pod-2`]);
});

test("instance: duplicates are dropped, tool results carry reply_to", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, instance: "pod-3" });
  const s = await c.openSession();
  await s.submitTurn("t1", "@dup");
  assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
  s.pendingCalls.set("t2", ["c1"]); // as if a tool_calls for t2 had asked for c1
  const sub = await s.submitToolResults("t2", [ToolResult.ok("c1", 1)]);
  assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t2");
  assert.equal(s.duplicatesDropped, 1);
  await c.close();
  const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
  assert.equal(req?.properties.replyTo, `${fake.prefix}.instance.pod-3`);
});

test("replies for a session not yet open wait for it", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, instance: "pod-4" });
  const first = await c.openSession();
  await first.submitTurn("t1", "before a restart");
  await first.close(); // the session is not open while its reply arrives
  for (let i = 0; i < 100 && !c.instance?.pendingSessions().includes(first.sessionId); i++) await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(c.instance?.pendingSessions(), [first.sessionId]);
  const again = await c.openSession(first.sessionId);
  const reply = await again.nextEvent({ timeoutMs: 10_000 });
  assert.equal(reply.type === "final" && reply.text, "echo: before a restart");
  await c.close();
});

test("the instance queue is durable with no arguments", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, instance: "pod-5" });
  const queue = c.instance!.queue;
  await c.close();
  const admin = await amqp.connect(ADMIN);
  const ch = await admin.createChannel();
  const ok = await ch.assertQueue(queue, { durable: true, arguments: {} }); // what the client declared, again
  assert.equal(ok.queue, queue);
  await ch.deleteQueue(queue);
  await admin.close();
});

// --- tenants -----------------------------------------------------------------------------------

test("the broker refuses a userId that is not the connection's", async () => {
  // Why `user_id` can name the tenant: RabbitMQ closes the channel (406) of such a publish.
  const conn = await amqp.connect(ADMIN);
  try {
    const ch = await conn.createConfirmChannel();
    ch.on("error", () => undefined);
    const confirmed = new Promise<void>((resolve, reject) => {
      ch.publish("", `${fake.prefix}.nowhere`, Buffer.from("{}"), { userId: `${urlUser(ADMIN)}-x` }, (err) => (err ? reject(err) : resolve()));
    });
    await assert.rejects(confirmed, /406|PRECONDITION|closed/i);
  } finally {
    await conn.close();
  }
});

test("a tenant turn on the wire", async () => {
  fake.tenants.set(urlUser(ADMIN), "t1");
  try {
    const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, tenant: "t1", schemas });
    assert.equal(c.tenant, "t1");
    const s = await c.openSession();
    assert.equal(s.queue, `${fake.prefix}.session.t1.${s.sessionId}`);
    assert.equal(s.replyTo, null);
    const sub = await s.submitTurn("t1", "hello tenant");
    const reply = await s.nextEvent({ timeoutMs: 10_000 });
    assert.equal(await queueExists(ADMIN, sessionQueue(fake.prefix, s.sessionId)), false, "none without the tenant");
    await c.close();
    assert.equal(reply.type === "final" && reply.text, "echo: hello tenant");
    const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
    assert.ok(req);
    assert.equal(req.fields.routingKey, s.sessionId);
    assert.equal(req.properties.userId, urlUser(ADMIN));
    assert.equal(req.properties.replyTo, undefined);
    assert.equal(await queueExists(ADMIN, s.queue), true); // durable, still there after the client closed
  } finally {
    fake.tenants.clear();
  }
});

test("a tenant instance turn on the wire", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix, tenant: "t1", instance: "pod-6" });
  const queue = `${fake.prefix}.instance.t1.pod-6`;
  assert.equal(c.instance?.queue, queue);
  const s = await c.openSession();
  const sub = await s.submitTurn("t1", "hello");
  const reply = await s.nextEvent({ timeoutMs: 10_000 });
  await c.close();
  assert.equal(reply.type === "final" && reply.sessionId, s.sessionId);
  const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
  assert.equal(req?.properties.replyTo, queue);
  assert.equal(sub.replyTo, queue);
  assert.equal(req?.properties.userId, urlUser(ADMIN));
});

// --- resuming by itself, and a queue the broker stopped consuming ------------------------------

const resumesOf = (turn: string) =>
  fake.requests.filter((m) => m.properties.type === "turn.resume" && JSON.parse(m.content.toString()).TurnId === turn);

test("a refused resume the client sent by itself is not the turn's reply", async () => {
  fake.refuseResumes = true;
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "@hold", { stream: true });
    await s.reopen(); // what a nack or a reconnect does: the streamed turn is resumed
    await until(() => resumesOf("t1").some((m) => m.fields.routingKey === s.sessionId));
    await new Promise((r) => setTimeout(r, 300)); // the refusal arrives
    await fake.finish("t1");
    const events = [];
    for await (const e of s.turnEvents("t1", { timeoutMs: 10_000 })) events.push(e.type);
    assert.deepEqual(events, ["final"]);
    assert.equal(s.resumes, 1);
  } finally {
    fake.refuseResumes = false;
    await c.close();
  }
});

test("a refused submission of a streamed turn does not end its resuming", async () => {
  // Another submission of a running turn refused: the turn goes on, and is resumed.
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "@hold", { stream: true });
    await s.submit({ SessionId: s.sessionId, TurnId: "t1", Instruction: "@refuse" });
    const refused = await s.nextEvent({ timeoutMs: 10_000, turnId: "t1" });
    assert.equal(refused.type === "refused" && refused.code, "turn.conflict");
    await s.reopen();
    await until(() => resumesOf("t1").some((m) => m.fields.routingKey === s.sessionId));
    await fake.finish("t1");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000, turnId: "t1" })).type, "final");
  } finally {
    await c.close();
  }
});

test("a streamed turn whose own request is refused is not resumed", async () => {
  // The request that would start it refused (nothing stored): there is no turn to resume.
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "@busy", { stream: true });
    const refused = await s.nextEvent({ timeoutMs: 10_000, turnId: "t1" });
    assert.equal(refused.type === "refused" && refused.code, "session.busy");
    await s.submitTurn("t2", "@hold", { stream: true });
    await s.reopen();
    await until(() => resumesOf("t2").some((m) => m.fields.routingKey === s.sessionId));
    assert.equal(resumesOf("t1").filter((m) => m.fields.routingKey === s.sessionId).length, 0);
    assert.equal(s.resumes, 1);
  } finally {
    await c.close();
  }
});

test("a copy of a streamed turn's request refused as an attach keeps it resumable", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "@attached", { stream: true });
    const refused = await s.nextEvent({ timeoutMs: 10_000, turnId: "t1" });
    assert.equal(refused.type === "refused" && refused.code, "limit.resumes_per_minute");
    await s.reopen();
    await until(() => resumesOf("t1").some((m) => m.fields.routingKey === s.sessionId));
    assert.equal(s.resumes, 1);
  } finally {
    await c.close();
  }
});

test("a session whose queue the broker deleted consumes it again", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "one");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).type, "final");
    const admin = await amqp.connect(ADMIN);
    await (await admin.createChannel()).deleteQueue(s.queue); // the broker cancels the consumer
    await admin.close();
    await until(() => s.restores === 1);
    await s.submitTurn("t2", "two");
    const e = await s.nextEvent({ timeoutMs: 10_000 });
    assert.deepEqual([e.type, e.turnId], ["final", "t2"]);
  } finally {
    await c.close();
  }
});

test("a session whose channel the broker closed consumes its queue again", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    await s.submitTurn("t1", "@hold");
    // An ack of a delivery tag the broker never gave (as its consumer timeout would): 406 closes the channel.
    const ch = (s as unknown as { ch: amqp.ConfirmChannel }).ch;
    ch.ack({ fields: { deliveryTag: 999_999 } } as amqp.Message);
    await until(() => s.restores === 1);
    await fake.finish("t1");
    const e = await s.nextEvent({ timeoutMs: 10_000 });
    assert.deepEqual([e.type, e.turnId], ["final", "t1"]);
  } finally {
    await c.close();
  }
});

test("two fresh channels asked for at once make one consumer", async () => {
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  const admin = await amqp.connect(ADMIN);
  try {
    const s = await c.openSession();
    await Promise.all([s.reopen(), s.reopen()]);
    const { consumerCount } = await (await admin.createChannel()).checkQueue(s.queue);
    assert.equal(consumerCount, 1);
    await s.submitTurn("t1", "one");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).type, "final");
  } finally {
    await admin.close();
    await c.close();
  }
});

test("an upper-case SessionId is written in lower case", async () => {
  const sid = randomUUID();
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession(sid.toUpperCase());
    assert.equal(s.sessionId, sid);
    assert.ok(s.queue.endsWith(sid));
    const sub = await s.submitTurn("t1", "hello");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).sessionId, sid);
    const req = fake.requests.find((m) => m.properties.messageId === sub.messageId);
    assert.equal(JSON.parse(req!.content.toString()).SessionId, sid);
  } finally {
    await c.close();
  }
});

test("a queue the user may not declare is an error, not a wait", async () => {
  // Restoring a queue the broker refuses for good (403: the user may not declare it; here a
  // reserved `amq.` name) fails the session with the broker's refusal.
  const c = await Client.connect({ url: ADMIN, prefix: fake.prefix });
  try {
    const s = await c.openSession();
    (s as unknown as { queue: string }).queue = "amq.aptix-forbidden";
    (s as unknown as { ch: amqp.ConfirmChannel }).ch.ack({ fields: { deliveryTag: 999_999 } } as amqp.Message);
    const started = Date.now();
    await assert.rejects(s.nextEvent({ timeoutMs: 10_000 }), /ACCESS_REFUSED|403/);
    assert.ok(Date.now() - started < 5_000);
  } finally {
    await c.close();
  }
});
