/**
 * Resuming a turn's stream, written from docs/client-protocol.md §4 and §9a alone (raw amqplib,
 * not the official client): a backend reads a few deltas, loses its process and its queue,
 * declares the queue again, publishes `turn.resume` with the last `x-aptix-event-seq` it handled,
 * holds the turn's events until the `resumed` notice, then handles every event once, in order.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as amqp from "amqplib";
import { simControl } from "./support";
import { Client, Delta, Final, Schemas, findSchemasDir } from "../src";

const PREFIX = process.env.APTIX_TEST_PREFIX;
const SIM = process.env.APTIX_TEST_SIM_URL;
const URL = process.env.APTIX_TEST_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const ready = Boolean(PREFIX && SIM);

type Msg = { type: string; id: string; headers: Record<string, unknown>; body: any };

/** One backend process: §4 steps 1-3 for one session. */
class Backend {
  private got: Msg[] = [];
  private wake: (() => void) | null = null;
  private constructor(
    readonly conn: amqp.ChannelModel,
    readonly ch: amqp.ConfirmChannel,
    readonly queue: string,
    readonly session: string,
  ) {}

  static async open(session: string): Promise<Backend> {
    const conn = await amqp.connect(URL);
    const ch = await conn.createConfirmChannel();
    const queue = `${PREFIX}.session.${session}`;
    await ch.assertQueue(queue, { durable: true, exclusive: false, autoDelete: false, arguments: {} });
    const b = new Backend(conn, ch, queue, session);
    await ch.consume(queue, (m) => {
      if (!m) return;
      ch.ack(m);
      const p = m.properties;
      b.got.push({ type: p.type, id: p.messageId, headers: p.headers ?? {}, body: JSON.parse(m.content.toString()) });
      b.wake?.();
    }, { noAck: false });
    return b;
  }

  async publish(body: unknown, type?: string): Promise<void> {
    const props = { deliveryMode: 2, contentType: "application/json", messageId: randomUUID(), type, mandatory: true };
    await new Promise<void>((ok, fail) =>
      this.ch.publish(`${PREFIX}.requests`, this.session, Buffer.from(JSON.stringify(body)), props, (e) => (e ? fail(e) : ok())),
    );
  }

  async until(done: (got: Msg[]) => boolean, timeoutMs = 90_000): Promise<Msg[]> {
    const deadline = Date.now() + timeoutMs;
    while (!done(this.got)) {
      if (Date.now() > deadline) throw new Error(`timed out with ${this.got.length} messages`);
      await new Promise<void>((r) => { this.wake = r; setTimeout(r, 200); });
    }
    return this.got;
  }

  async close(): Promise<void> {
    await this.conn.close();
  }
}

const seq = (m: Msg) => Number(m.headers["x-aptix-event-seq"]);

describe("resuming a stream (§9a)", { skip: ready ? false : "no pipeline: run clients/run-tests.sh" }, () => {
  test("a backend resumes a stream it lost", async () => {
    await simControl({ command: "set_latency", latency: { per_event_ms: 40 } });
    try {
      const session = randomUUID();
      const first = await Backend.open(session);
      const long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail ".repeat(12);
      await first.publish({ SessionId: session, TurnId: "t1", Instruction: long, Stream: true });
      const seen = (await first.until((got) => got.length >= 3)).slice(0, 3);
      assert.deepEqual(seen.map((m) => m.type), ["delta", "delta", "delta"]);
      const last = seq(seen[2]);
      // The process dies, its queue with it; what is published meanwhile is lost.
      await first.ch.deleteQueue(first.queue);
      await first.close();
      await new Promise((r) => setTimeout(r, 600));

      const second = await Backend.open(session);
      await second.publish({ SessionId: session, TurnId: "t1", AfterSeq: last }, "turn.resume");
      const got = await second.until((g) => g.some((m) => m.type === "resumed") && g.some((m) => m.type === "reply" && m.headers["x-aptix-final"] === true));
      const notice = got.find((m) => m.type === "resumed")!;
      assert.equal(notice.body.AfterSeq, last);
      const ids = new Set(seen.map((m) => m.id));
      const handled = got
        .filter((m) => m.type !== "resumed")
        .sort((a, b) => seq(a) - seq(b))
        .filter((m) => seq(m) > last && !ids.has(m.id) && ids.add(m.id));
      const deltas = handled.filter((m) => m.type === "delta").map(seq);
      assert.deepEqual(deltas, deltas.map((_, i) => last + 1 + i), "no delta missing");
      const reply = handled[handled.length - 1];
      assert.deepEqual([reply.type, seq(reply)], ["reply", 999_999]);
      const text = (ms: Msg[]) => ms.filter((m) => m.type === "delta" && m.body.Event.Type === "OutputText").map((m) => m.body.Event.Text).join("");
      assert.equal(text(seen) + text(handled), reply.body.Result.PrimaryOutputText);
      await second.close();
    } finally {
      await simControl({ command: "set_latency", latency: {} });
    }
  });

  test("the official client resumes a stream by itself after a reconnect", async () => {
    await simControl({ command: "set_latency", latency: { per_event_ms: 40 } });
    const client = await Client.connect({ url: URL, prefix: PREFIX, schemas: new Schemas(findSchemasDir(__dirname)!), strict: true });
    try {
      const s = await client.openSession();
      const long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail ".repeat(12);
      await s.submitTurn("t1", long, { stream: true });
      const got = [];
      for (let i = 0; i < 3; i++) got.push(await s.nextEvent({ timeoutMs: 90_000, turnId: "t1" }));
      assert.ok(got.every((e) => e.type === "delta"));
      // The connection goes, and the queue with what it held; the stream goes on.
      const admin = await amqp.connect(URL);
      const ch = await admin.createChannel();
      await ch.deleteQueue(s.queue);
      await admin.close();
      await client.conn.close();
      const rest = [];
      for await (const e of s.turnEvents("t1", { timeoutMs: 90_000 })) rest.push(e);
      const final = rest[rest.length - 1] as Final;
      assert.equal(final.type, "final");
      assert.equal(s.resumes, 1);
      const deltas = [...got, ...rest.slice(0, -1)] as Delta[];
      const numbers = deltas.map((d) => Number(d.headers["x-aptix-event-seq"]));
      assert.deepEqual(numbers, numbers.map((_, i) => i), "every delta once, in order");
      assert.equal(deltas.map((d) => d.text).join(""), final.text);
    } finally {
      await client.close();
      await simControl({ command: "set_latency", latency: {} });
    }
  });
});
