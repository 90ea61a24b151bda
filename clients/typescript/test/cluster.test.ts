// Broker clusters without a cluster: the node list, node rotation on connect, reconnecting after a
// connection loss, and publishing again after a nack.
//
// The "nodes" are local TCP forwarders to the one service broker (127.0.0.1:5672): `drop()`
// severs every connection through one (as a node loss does), `stop()` makes it refuse new ones.
// A port that refuses and a listener that never answers stand for dead nodes. Nacks are real: a
// queue with `x-overflow: reject-publish` and `x-max-length: 0` bound to the requests exchange
// nacks every request routed to it. Everything lives under a random prefix and is deleted after.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as net from "node:net";
import * as amqp from "amqplib";
import { declareStandIn } from "./stand-in";
import { until } from "./support";

import { Client, ConnectionLost, PublishError, Session, connectAny, parseUrls, redactUrl } from "../src";

const ADMIN = process.env.APTIX_TEST_ADMIN_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const url = (port: number) => `amqp://guest:guest@127.0.0.1:${port}/%2f`;
type Conn = Awaited<ReturnType<typeof amqp.connect>>;

/** A TCP forwarder to the broker, standing for one cluster node. */
class Proxy {
  private readonly server = net.createServer((down) => this.accept(down));
  private readonly sockets = new Set<net.Socket>();
  accepted = 0;
  port = 0;

  async listen(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
    return this;
  }
  get url(): string {
    return url(this.port);
  }
  private accept(down: net.Socket): void {
    this.accepted++;
    const up = net.connect(5672, "127.0.0.1");
    for (const [a, b] of [[down, up], [up, down]]) {
      this.sockets.add(a);
      a.on("error", () => b.destroy());
      a.on("close", () => b.destroy());
      a.pipe(b);
    }
  }
  /** Severs every connection through this node, on both sides. */
  drop(): void {
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }
  /** Refuses new connections too. */
  async stop(): Promise<void> {
    this.drop();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

async function refusedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

/** Answers each request with a final reply (on the session's queue, or on its reply_to instance queue). */
class EchoServer {
  readonly prefix = `tsk-${randomUUID().slice(0, 12)}`;
  readonly requests: amqp.ConsumeMessage[] = [];
  readonly queues = new Set<string>();
  conn!: Conn;
  ch!: amqp.ConfirmChannel;

  async start(): Promise<void> {
    this.conn = await amqp.connect(ADMIN);
    const ch = (this.ch = await this.conn.createConfirmChannel());
    const ingress = await declareStandIn(ch, this.prefix);
    await ch.consume(ingress, (m) => m && void this.answer(m));
  }

  private async answer(m: amqp.ConsumeMessage): Promise<void> {
    this.requests.push(m);
    const req = JSON.parse(m.content.toString());
    const [s, t] = [req.SessionId as string, req.TurnId as string];
    const replyTo = m.properties.replyTo ? String(m.properties.replyTo) : "";
    let key = s;
    if (replyTo) {
      key = `instance.${replyTo.slice(`${this.prefix}.instance.`.length)}`;
      this.queues.add(replyTo);
      await this.ch.bindQueue(replyTo, `${this.prefix}.replies`, key);
    } else {
      const q = `${this.prefix}.session.${s}`;
      this.queues.add(q);
      await this.ch.assertQueue(q, { durable: true, arguments: {} });
      await this.ch.bindQueue(q, `${this.prefix}.replies`, s);
    }
    const headers = { "x-aptix-session-id": s, "x-aptix-turn-id": t, "x-aptix-kind": "reply", "x-aptix-final": true, "x-aptix-step": 0, "x-aptix-outcome": "final" };
    const body = { Successful: true, Errors: [], Warnings: [], Result: { SessionId: s, TurnId: t, ModeDisplayName: "General", Kind: "final", PrimaryOutputText: `echo: ${req.Instruction}` } };
    this.ch.publish(`${this.prefix}.replies`, key, Buffer.from(JSON.stringify(body)), {
      type: "reply", messageId: `reply:${s}:${t}:step-0`, contentType: "application/json", deliveryMode: 2, headers, mandatory: true,
    });
    await this.ch.waitForConfirms();
    this.ch.ack(m);
  }

  async stop(): Promise<void> {
    for (const q of [...this.queues, `${this.prefix}.requests`, `${this.prefix}.full`]) await this.ch.deleteQueue(q);
    for (const x of ["requests", "replies"]) await this.ch.deleteExchange(`${this.prefix}.${x}`);
    await this.conn.close();
  }
}

const echo = new EchoServer();
before(() => echo.start());
after(() => echo.stop());

async function withProxies(n: number, body: (proxies: Proxy[]) => Promise<void>): Promise<void> {
  const proxies = await Promise.all(Array.from({ length: n }, () => new Proxy().listen()));
  try {
    await body(proxies);
  } finally {
    for (const p of proxies) await p.stop();
  }
}

// --- the node list -------------------------------------------------------------------------------

test("urls: one, comma-separated, or an array", () => {
  const [a, b, c] = [1, 2, 3].map(url);
  assert.deepEqual(parseUrls(a), [a]);
  assert.deepEqual(parseUrls(`${a}, ${b},${c},`), [a, b, c]);
  assert.deepEqual(parseUrls([a, `${b},${c}`]), [a, b, c]);
  for (const empty of ["", " , ", []]) assert.throws(() => parseUrls(empty), /no broker URL/);
  assert.equal(redactUrl("amqp://u:secret@n1:5672/%2f"), "amqp://u:***@n1:5672/%2f");
  assert.equal(redactUrl("amqp://n1/%2f"), "amqp://n1/%2f");
});

test("connect starts at a random node and moves on", async () => {
  const tried: [string, unknown][] = [];
  const fakeConnect = async (u: string, opts: Record<string, unknown>) => {
    tried.push([u, opts]);
    if (u !== url(3)) throw new Error("refused");
    return { close: async () => undefined } as unknown as Conn;
  };
  const urls = [1, 2, 3, 4, 5].map(url);
  const { node } = await connectAny(urls, { timeoutMs: 1500, connectionName: "me" }, fakeConnect, () => 0.7);
  assert.equal(node, 2);
  assert.deepEqual(tried.map(([u]) => u), [4, 5, 1, 2, 3].map(url), "from the random start, round the list");
  assert.deepEqual(tried[0][1], { timeout: 1500, clientProperties: { connection_name: "me" } });
  await assert.rejects(connectAny([url(1), url(2)], { timeoutMs: 100, connectionName: "me" }, fakeConnect, () => 0),
    (e: Error) => /guest:\*\*\*@127\.0\.0\.1:1\//.test(e.message) && !e.message.includes("guest:guest"));
  // A node that never answers is left after the timeout.
  const silent = async () => new Promise<Conn>(() => undefined);
  const t0 = Date.now();
  await assert.rejects(connectAny([url(1)], { timeoutMs: 100, connectionName: "me" }, silent), /no answer within 100 ms/);
  assert.ok(Date.now() - t0 < 1000);
});

test("a node that refuses or is silent is skipped", async () => {
  const held: net.Socket[] = [];
  const silent = net.createServer((sock) => void held.push(sock)); // takes the TCP connection, never says a word
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const silentUrl = url((silent.address() as net.AddressInfo).port);
  try {
    const nodes = [url(await refusedPort()), silentUrl, ADMIN];
    for (let i = 0; i < 3; i++) {
      const t0 = Date.now();
      const c = await Client.connect({ url: nodes, prefix: echo.prefix, connectTimeoutMs: 500 });
      assert.equal(c.node, 2);
      await c.close();
      assert.ok(Date.now() - t0 < 3000);
    }
  } finally {
    for (const sock of held) sock.destroy();
    silent.close();
  }
});

// --- reconnecting --------------------------------------------------------------------------------

test("a lost connection is taken again and the session queue consumed again", () =>
  withProxies(2, async (proxies) => {
    const c = await Client.connect({ url: proxies.map((p) => p.url), prefix: echo.prefix, reconnectBackoffMs: [50, 200] });
    const s = await c.openSession();
    await s.submitTurn("t1", "one");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
    await s.submitTurn("t2", "two");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t2"); // acks t1; t2 not acked yet
    // basic.ack has no answer: a round trip on the same channel proves the broker took t1's ack
    // before the node goes (else t1 comes again too, which is correct but not this test's count).
    const own = (s as unknown as { ownCh: amqp.ConfirmChannel }).ownCh;
    await own.checkQueue(s.queue);
    for (const p of proxies) p.drop(); // the node is lost
    const sub = await s.submitTurn("t3", "three"); // sent again if its confirm was lost
    assert.ok(sub.attempts >= 1);
    const e = await s.nextEvent({ timeoutMs: 10_000 });
    assert.equal(e.type === "final" && e.turnId === "t3" && e.text, "echo: three");
    assert.equal(c.reconnects, 1);
    assert.equal(s.duplicatesDropped, 1, "t2 came again and was dropped by message_id");
    assert.equal(proxies[0].accepted + proxies[1].accepted, 2);
    await c.close();
  }));

test("an instance queue is declared and consumed again", () =>
  withProxies(2, async (proxies) => {
    const c = await Client.connect({ url: proxies.map((p) => p.url).join(","), prefix: echo.prefix, instance: "pod-r", reconnectBackoffMs: [50, 200] });
    const s = await c.openSession();
    await s.submitTurn("t1", "one");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
    const before = c.instance?.channel;
    for (const p of proxies) p.drop();
    const deadline = Date.now() + 10_000;
    while (c.reconnects === 0) {
      assert.ok(Date.now() < deadline, "reconnected");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.notEqual(c.instance?.channel, before);
    await s.submitTurn("t2", "two");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t2");
    assert.equal(s.duplicatesDropped, 1, "t1, not acked before the loss");
    await c.close();
  }));

test("a queue the broker refuses after a reconnect does not stop the other sessions", () =>
  withProxies(2, async (proxies) => {
    // After a reconnect one session's queue cannot be declared (as while its node is down: here
    // it was declared again with other arguments, so the broker refuses the client's, 406).
    const c = await Client.connect({ url: proxies.map((p) => p.url), prefix: echo.prefix, reconnectBackoffMs: [50, 200], reconnectTimeoutMs: 5_000 });
    const admin = await amqp.connect(ADMIN);
    const ch = await admin.createChannel();
    try {
      const [a, b] = [await c.openSession(), await c.openSession()];
      echo.queues.add(a.queue).add(b.queue);
      for (const p of proxies) p.drop();
      await ch.deleteQueue(a.queue);
      await ch.assertQueue(a.queue, { durable: true, arguments: { "x-max-length": 5 } });
      await b.submitTurn("t1", "for b"); // notices the loss, reconnects: a's declaration is refused
      assert.equal((await b.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
      assert.equal(c.reconnects, 1);
      await ch.deleteQueue(a.queue); // a declares it again by itself, with back-off
      await until(() => a.restores >= 1);
      assert.equal(a.restores, 1);
      await a.submitTurn("t2", "for a");
      const e = await a.nextEvent({ timeoutMs: 10_000 });
      assert.equal(e.type === "final" && e.turnId, "t2");
    } finally {
      await admin.close();
      await c.close();
    }
  }));

test("no node left: waiting calls reject with ConnectionLost", () =>
  withProxies(1, async ([one]) => {
    const c = await Client.connect({ url: one.url, prefix: echo.prefix, reconnectBackoffMs: [50, 100], reconnectTimeoutMs: 500 });
    const s = await c.openSession();
    echo.queues.add(s.queue);
    await one.stop();
    const t0 = Date.now();
    await assert.rejects(s.nextEvent({ timeoutMs: 5_000 }), (e: Error) => e instanceof ConnectionLost && /no broker node took a new one/.test(e.message));
    assert.ok(Date.now() - t0 < 3_000);
    await c.close();
  }));

test("without reconnect, the loss rejects at once", () =>
  withProxies(1, async ([one]) => {
    const c = await Client.connect({ url: one.url, prefix: echo.prefix, reconnect: false });
    const s = await c.openSession();
    echo.queues.add(s.queue);
    one.drop();
    await assert.rejects(s.nextEvent({ timeoutMs: 5_000 }), (e: Error) => !(e.name === "EventTimeout"));
    await c.close();
  }));

// --- publishing again ----------------------------------------------------------------------------

async function blockRequests(): Promise<{ ch: amqp.Channel; conn: Conn; full: string }> {
  const conn = await amqp.connect(ADMIN);
  const ch = await conn.createChannel();
  const full = `${echo.prefix}.full`;
  await ch.assertQueue(full, { arguments: { "x-max-length": 0, "x-overflow": "reject-publish" } });
  await ch.bindQueue(full, `${echo.prefix}.requests`, "#");
  return { ch, conn, full };
}

test("a nacked request is sent again on a fresh channel", async () => {
  const { ch, conn, full } = await blockRequests();
  try {
    const c = await Client.connect({ url: ADMIN, prefix: echo.prefix });
    const s = await c.openSession();
    const first = (s as unknown as { ownCh: amqp.ConfirmChannel }).ownCh;
    const publish = first.publish.bind(first);
    // The node recovers once it nacked the first attempt.
    first.publish = (x, k, body, props, cb) =>
      publish(x, k, body, props, (err, ok) => void ch.deleteQueue(full).then(() => cb?.(err, ok)));
    const sub = await s.submitTurn("t1", "nacked once");
    assert.equal(sub.attempts, 2);
    assert.notEqual((s as unknown as { ownCh: amqp.ConfirmChannel }).ownCh, first, "the channel that nacked is not reused");
    assert.equal((await s.nextEvent({ timeoutMs: 10_000 })).turnId, "t1");
    const ids = new Set(echo.requests.filter((m) => JSON.parse(m.content.toString()).SessionId === s.sessionId).map((m) => m.properties.messageId));
    assert.deepEqual([...ids], [sub.messageId], "every copy has the same message_id");
    await c.close();
  } finally {
    await ch.deleteQueue(full);
    await conn.close();
  }
});

test("a request nacked every time is a PublishError", async () => {
  const { ch, conn, full } = await blockRequests();
  try {
    const c = await Client.connect({ url: ADMIN, prefix: echo.prefix, publishAttempts: 3 });
    const s: Session = await c.openSession();
    echo.queues.add(s.queue);
    await assert.rejects(s.submitTurn("t1", "never"), (e: Error) => e instanceof PublishError && /nacked request .* \(gave up after 3 attempts\)/.test(e.message));
    await c.close();
  } finally {
    await ch.deleteQueue(full);
    await conn.close();
  }
});
