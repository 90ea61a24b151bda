// Replies per instance (protocol §4a) without a broker: the client's `Instance` and its sessions
// over a scripted fake of amqplib's confirm channel, checking what is declared, consumed,
// published and acked, and how the messages of one queue are handed to many sessions. Then
// tenants, the same way: the userId of every request, the tenant's queue names, and the checks
// made before connecting.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { ConfirmChannel, ConsumeMessage } from "amqplib";

import { Client, Instance, ProtocolError, SeenIds, Session, ToolResult } from "../src";

const PREFIX = "unit";
const QUEUE = `${PREFIX}.instance.pod-1`;
const A = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
const B = "0b4d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
const C = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d";

interface Published {
  exchange: string;
  routingKey: string;
  body: Record<string, unknown>;
  props: Record<string, unknown>;
}

class FakeChannel {
  readonly declared: { queue: string; options: unknown }[] = [];
  readonly consumers: { queue: string; noAck: unknown; onMessage: (m: ConsumeMessage | null) => void }[] = [];
  readonly published: Published[] = [];
  readonly acked: number[] = [];
  readonly deleted: string[] = [];
  closed = false;
  private tag = 0;

  on(): this {
    return this;
  }
  async assertQueue(queue: string, options: unknown): Promise<unknown> {
    this.declared.push({ queue, options });
    return { queue, messageCount: 0, consumerCount: 0 };
  }
  async consume(queue: string, onMessage: (m: ConsumeMessage | null) => void, options: { noAck?: boolean }): Promise<unknown> {
    this.consumers.push({ queue, noAck: options.noAck, onMessage });
    return { consumerTag: "ctag" };
  }
  publish(exchange: string, routingKey: string, content: Buffer, props: Record<string, unknown>, cb: (err: unknown) => void): boolean {
    this.published.push({ exchange, routingKey, body: JSON.parse(content.toString()), props });
    setImmediate(() => cb(null));
    return true;
  }
  ack(m: ConsumeMessage): void {
    this.acked.push(m.fields.deliveryTag);
  }
  async deleteQueue(queue: string): Promise<unknown> {
    this.deleted.push(queue);
    return { messageCount: 0 };
  }
  async close(): Promise<void> {
    this.closed = true;
  }

  /** A server message arrives on the instance queue; returns its delivery tag. */
  arrive(headers: Record<string, unknown>, body: unknown, messageId: string, type = "reply"): number {
    const deliveryTag = ++this.tag;
    const msg = {
      content: Buffer.from(JSON.stringify(body)),
      fields: { deliveryTag, redelivered: false, exchange: `${PREFIX}.replies`, routingKey: "instance.pod-1", consumerTag: "ctag" },
      properties: { type, messageId, headers, contentType: "application/json", deliveryMode: 2 },
    } as unknown as ConsumeMessage;
    this.consumers[0].onMessage(msg);
    return deliveryTag;
  }

  final(sid: string, turn: string, step = 0): number {
    const headers = {
      "x-aptix-session-id": sid, "x-aptix-turn-id": turn, "x-aptix-kind": "reply",
      "x-aptix-final": true, "x-aptix-step": step, "x-aptix-outcome": "final",
    };
    const body = {
      Successful: true, Errors: [], Warnings: [],
      Result: { SessionId: sid, TurnId: turn, ModeDisplayName: "General", Kind: "final", PrimaryOutputText: `${sid.slice(0, 4)} ${turn}` },
    };
    return this.arrive(headers, body, `reply:${sid}:${turn}:step-${step}`);
  }
}

/** What a Session and an Instance use of a Client, over one scripted channel. */
function fakeClient(ch: FakeChannel, who: { tenant?: string; userId?: string } = {}, onChannel: () => void = () => undefined): Client {
  return {
    prefix: PREFIX,
    ...who,
    strict: true,
    schemas: null,
    wireLog: undefined,
    conn: {
      createConfirmChannel: async () => {
        onChannel();
        return ch as unknown as ConfirmChannel;
      },
    },
    forget: () => undefined,
  } as unknown as Client;
}

async function setup(
  who: { tenant?: string; userId?: string } = {},
): Promise<{ ch: FakeChannel; inst: Instance; client: Client; channels: () => number }> {
  const ch = new FakeChannel();
  let opened = 0;
  const client = fakeClient(ch, who, () => {
    opened++;
  });
  const inst = await Instance.start(client, "pod-1");
  return { ch, inst, client, channels: () => opened };
}

const next = (s: Session, turnId?: string) => s.nextEvent({ timeoutMs: 1000, turnId });

test("the instance queue is declared once and consumed with manual acks", async () => {
  const { ch, inst, channels } = await setup();
  assert.equal(inst.queue, QUEUE);
  assert.deepEqual(ch.declared, [{ queue: QUEUE, options: { durable: true, exclusive: false, autoDelete: false, arguments: {} } }]);
  assert.deepEqual(ch.consumers.map((c) => [c.queue, c.noAck]), [[QUEUE, false]]);
  for (const sid of [A, B, C]) {
    const s = inst.open(sid);
    assert.equal(s.queue, QUEUE);
    assert.equal(s.replyTo, QUEUE);
    assert.equal(s.instance, inst);
  }
  assert.equal(channels(), 1, "sessions of an instance open no channel");
  assert.equal(ch.declared.length + ch.consumers.length, 2, "and declare or consume nothing");
});

test("every request carries reply_to", async () => {
  const { ch, inst } = await setup();
  const s = inst.open(A);
  const sub = await s.submitTurn("t1", "hello");
  s.pendingCalls.set("t1", ["c1"]);
  const tools = await s.submitToolResults("t1", [ToolResult.ok("c1", { x: 1 })]);
  const raw = await s.submit({ SessionId: A, TurnId: "t2", Instruction: "x" }, { replyTo: "amq.rabbitmq.reply-to" });
  assert.deepEqual(ch.published.map((m) => m.props.replyTo), [QUEUE, QUEUE, "amq.rabbitmq.reply-to"]);
  assert.deepEqual([sub.replyTo, tools.replyTo, raw.replyTo], [QUEUE, QUEUE, "amq.rabbitmq.reply-to"]);
  for (const m of ch.published) {
    assert.deepEqual([m.exchange, m.routingKey, m.props.mandatory, m.props.deliveryMode], [`${PREFIX}.requests`, A, true, 2]);
  }
});

test("messages go to their session, in order", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  const b = inst.open(B);
  ch.final(A, "t0");
  ch.final(B, "t0");
  ch.final(A, "t1");
  ch.final(B, "t1");
  assert.deepEqual([(await next(b)).turnId, (await next(b)).turnId], ["t0", "t1"]);
  const first = await next(a);
  assert.equal(first.type === "final" && first.text, `${A.slice(0, 4)} t0`);
  assert.equal(first.sessionId, A);
  assert.equal((await next(a, "t1")).turnId, "t1");
  assert.deepEqual(ch.acked, [2, 1], "acked once handled");
  await a.close();
  await b.close();
  assert.deepEqual([...ch.acked].sort(), [1, 2, 3, 4]);
  assert.equal(ch.closed, false, "closing a session leaves the instance's channel open");
});

test("a waiting nextEvent wakes up when its message arrives", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  const waiting = next(a);
  setTimeout(() => ch.final(A, "t0"), 20);
  assert.equal((await waiting).turnId, "t0");
});

test("messages of a session not open wait for it", async () => {
  const { ch, inst } = await setup();
  ch.final(C, "t0");
  ch.final(C, "t1");
  assert.deepEqual(inst.pendingSessions(), [C]);
  assert.deepEqual(ch.acked, []);
  const c = inst.open(C);
  assert.deepEqual(inst.pendingSessions(), []);
  assert.deepEqual([(await next(c)).turnId, (await next(c)).turnId], ["t0", "t1"]);
});

test("copies are dropped by message_id, even after close", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  ch.final(A, "t0");
  ch.final(A, "t0");
  assert.equal((await next(a)).turnId, "t0");
  assert.equal(a.duplicatesDropped, 1);
  assert.deepEqual(ch.acked, [2]);
  await a.close();
  const late = ch.final(A, "t0");
  assert.equal(inst.duplicatesDropped, 1);
  assert.ok(ch.acked.includes(late));
  assert.deepEqual(inst.pendingSessions(), []);
});

test("unread messages go back to the session when it is reopened", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  const first = ch.final(A, "t0");
  const second = ch.final(A, "t1");
  assert.equal((await next(a)).turnId, "t0");
  await a.close();
  await assert.rejects(next(a), /session closed/);
  assert.deepEqual(ch.acked, [first]);
  assert.deepEqual(inst.pendingSessions(), [A]);
  const again = inst.open(A);
  assert.throws(() => inst.open(A), /already open/);
  assert.equal((await next(again)).turnId, "t1");
  assert.equal(again.duplicatesDropped, 0);
  await again.close();
  assert.deepEqual(ch.acked, [first, second]);
});

test("a message naming no session is acked and reported", async () => {
  const { ch, inst } = await setup();
  const tag = ch.arrive({ "x-aptix-kind": "reply" }, { Successful: false, Result: null }, "odd");
  assert.deepEqual(ch.acked, [tag]);
  assert.equal(inst.unroutable.length, 1);
  assert.ok(inst.unroutable[0] instanceof ProtocolError);
});

test("a refusal goes to its session by header", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  ch.arrive(
    { "x-aptix-session-id": A, "x-aptix-turn-id": "t1", "x-aptix-kind": "reply", "x-aptix-final": true, "x-aptix-outcome": "refused" },
    { Successful: false, Result: null, Warnings: [], Errors: [{ Code: "request.reply_to_invalid", Message: "no" }] },
    `reply:${A}:t1:rejected-0123456789abcdef01234567`,
  );
  const r = await next(a);
  assert.equal(r.type === "refused" && r.code, "request.reply_to_invalid");
});

test("an instance session has no queue to delete", async () => {
  const { ch, inst } = await setup();
  const a = inst.open(A);
  await assert.rejects(a.deleteQueue(), /no queue of its own/);
  await inst.deleteQueue();
  assert.deepEqual(ch.deleted, [QUEUE]);
});

test("a bad instance name is refused before connecting", async () => {
  for (const bad of ["", "a b", "x".repeat(65), "pod/1"]) {
    await assert.rejects(Client.connect({ url: "amqp://nobody:nothing@127.0.0.1:1/%2f", instance: bad }), /instance name/);
  }
});

// --- tenants -----------------------------------------------------------------------------------

test("bad tenant names and mixed users are refused before connecting", async () => {
  for (const bad of ["", "T1", "a.b", "-a", "x".repeat(33), "t 1"]) {
    await assert.rejects(Client.connect({ url: "amqp://nobody:nothing@127.0.0.1:1/%2f", tenant: bad }), /tenant name/);
  }
  await assert.rejects(Client.connect({ url: "amqp://a:x@127.0.0.1:1/%2f,amqp://b:x@127.0.0.1:2/%2f" }), /different users/);
});

test("every request carries userId", async () => {
  const { ch, inst } = await setup({ userId: "aptix-client-1" });
  const s = inst.open(A);
  await s.submitTurn("t1", "x");
  s.pendingCalls.set("t1", ["c1"]);
  await s.submitToolResults("t1", [ToolResult.ok("c1", 1)]);
  await s.submit({ SessionId: A, TurnId: "t2", Instruction: "x" }, { replyTo: "elsewhere" });
  assert.deepEqual(ch.published.map((m) => m.props.userId), ["aptix-client-1", "aptix-client-1", "aptix-client-1"]);
});

test("a tenant's instance queue carries its name and is the replyTo", async () => {
  const { ch, inst } = await setup({ tenant: "acme", userId: "acme-backend" });
  const queue = `${PREFIX}.instance.acme.pod-1`;
  assert.equal(inst.queue, queue);
  assert.deepEqual(ch.declared.map((d) => d.queue), [queue]);
  assert.deepEqual(ch.consumers.map((c) => [c.queue, c.noAck]), [[queue, false]]);
  const s = inst.open(A);
  const sub = await s.submitTurn("t1", "hello");
  assert.deepEqual([s.queue, s.replyTo, sub.replyTo], [queue, queue, queue]);
  assert.deepEqual([ch.published[0].props.replyTo, ch.published[0].props.userId], [queue, "acme-backend"]);
});

test("a tenant's session queue carries its name", async () => {
  const ch = new FakeChannel();
  const s = new Session(fakeClient(ch, { tenant: "t1", userId: "tenant-user" }), A, ch as unknown as ConfirmChannel);
  await s.start();
  assert.equal(s.queue, `${PREFIX}.session.t1.${A}`);
  assert.equal(s.replyTo, null);
  assert.deepEqual(ch.declared, [{ queue: s.queue, options: { durable: true, arguments: {} } }]);
  assert.deepEqual(ch.consumers.map((c) => [c.queue, c.noAck]), [[s.queue, false]]);
  await s.submitTurn("t1", "x");
  assert.equal(ch.published[0].props.replyTo, undefined);
  assert.equal(ch.published[0].props.userId, "tenant-user");
});

test("the ids remembered are bounded", () => {
  // A session remembers the newest ids only: a backend that lives for months does not keep
  // every id it ever saw.
  const ids = new SeenIds(3);
  for (const id of ["a", "b", "c", "d"]) ids.add(id);
  assert.deepEqual([...ids], ["b", "c", "d"]);
  ids.add("b"); // seen again: now the newest
  ids.add("e");
  assert.deepEqual([...ids], ["d", "b", "e"]);
});

test("an instance forgets the ids of its oldest closed sessions", async () => {
  const { ch, inst } = await setup();
  for (const sid of [B, A]) {
    const s = inst.open(sid);
    ch.final(sid, "t0");
    assert.equal((await next(s)).turnId, "t0");
    await s.close();
  }
  // B was opened first but closed first too; reopened and closed again, it is the newest closed.
  const b = inst.open(B);
  await b.close();
  assert.equal(inst.seen(B).size, 1);
  inst.seen(C, 1); // as if at most one closed session were remembered
  assert.equal(inst.seen(B, 2).size, 1, "B, closed last, is remembered");
  assert.equal(inst.seen(A, 2).size, 0, "A's ids were forgotten when C's were first kept");
});
