// The client against the REAL pipeline (`aptix run` + `aptix sim`, started by
// clients/run-tests.sh): a plain turn, a client tool round trip with a streamed follow-up, a
// duplicate, a conflict, validation refusals, and 20 sessions x 5 turns published at once. Then
// replies per instance (protocol §4a): 10 sessions x 3 turns on one instance queue, a tool round
// trip and a take-over by another instance, and the refusal of a `reply_to` that names no reply
// queue. Then cancels (protocol §7a): of a queued and of a streaming turn, of a turn waiting for
// tool results, and the refusals of cancels that change nothing. Every received body is checked
// against the repository's schemas and every header against protocol v3.
// Needs APTIX_TEST_PREFIX and APTIX_TEST_SIM_URL; skipped without them unless
// APTIX_TEST_REQUIRE_PIPELINE=1.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { execFileSync } from "node:child_process";
import * as amqp from "amqplib";
import { simControl } from "./support";
import { queueExists } from "./stand-in";

import {
  AptixEvent,
  CODE_REPLY_TO_INVALID,
  CODE_SESSION_BUSY,
  CODE_TOOL_RESULTS_TURN_CANCELLED,
  CODE_TURN_CANCELLED,
  CODE_TURN_FINISHED,
  CODE_TURN_STEERED,
  CODE_TURN_NOT_FOUND,
  Client,
  Delta,
  Failed,
  Final,
  H_PROTOCOL,
  PROTOCOL_VERSION,
  Refused,
  Reply,
  Schemas,
  Session,
  ToolResult,
  findSchemasDir,
  sessionQueue,
} from "../src";

const PREFIX = process.env.APTIX_TEST_PREFIX;
const SIM = process.env.APTIX_TEST_SIM_URL;
const URL = process.env.APTIX_TEST_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const WAIT = { timeoutMs: 90_000 };
const ready = Boolean(PREFIX && SIM);

if (!ready && process.env.APTIX_TEST_REQUIRE_PIPELINE === "1") {
  throw new Error("APTIX_TEST_PREFIX and APTIX_TEST_SIM_URL must be set");
}

async function collect(it: AsyncIterable<AptixEvent>): Promise<AptixEvent[]> {
  const out: AptixEvent[] = [];
  for await (const e of it) out.push(e);
  return out;
}

/** How many Responses API requests the simulator logged whose body mentions `marker`. */
async function llmCallsMentioning(marker: string): Promise<number> {
  const res = await fetch(`${SIM!.replace(/\/v1\/?$/, "")}/_sim/requests`);
  const bodies = (await res.json()) as unknown[];
  return bodies.filter((b) => JSON.stringify(b).includes(marker)).length;
}

function asFinal(e: AptixEvent | undefined): Final {
  assert.equal(e?.type, "final", JSON.stringify(e?.body));
  return e as Final;
}

function asFailed(e: AptixEvent | undefined): Failed {
  assert.equal(e?.type, "failed", JSON.stringify(e?.body));
  return e as Failed;
}

function asRefused(e: AptixEvent | undefined): Refused {
  assert.equal(e?.type, "refused", JSON.stringify(e?.body));
  return e as Refused;
}

describe("real pipeline", { skip: ready ? false : "no pipeline: run clients/run-tests.sh" }, () => {
  let client: Client;
  before(async () => {
    client = await Client.connect({ url: URL, prefix: PREFIX, schemas: new Schemas(findSchemasDir(__dirname)!), strict: true });
  });
  after(() => client.close());

  test("a user turn gets its final reply", async () => {
    const s = await client.openSession();
    await s.submitTurn("t1", "hello from node");
    const events = await collect(s.turnEvents("t1", WAIT));
    assert.equal(events.length, 1);
    const reply = asFinal(events[0]);
    assert.equal(reply.final, true);
    assert.equal(reply.outcome, "final");
    assert.equal(reply.step, 0);
    assert.equal(reply.messageId, `reply:${s.sessionId}:t1:step-0`);
    assert.ok(reply.text.split("\n").includes("instruction: hello from node"), reply.text);
    assert.ok(reply.traceparent);
    await assert.rejects(s.nextEvent({ timeoutMs: 1000 }), /no event/);
  });

  test("a SessionId spelt in upper case gets its replies", async () => {
    // A GUID as .NET or Windows writes it: the client writes it in lower case, as the server does.
    const sid = randomUUID();
    const s = await client.openSession(sid.toUpperCase());
    assert.equal(s.sessionId, sid);
    const reply = await s.runTurn("t1", "hello in capitals", { timeoutMs: WAIT.timeoutMs });
    assert.equal(reply.type, "final");
    assert.equal(reply.sessionId, sid);
  });

  test("a client's trace context is continued with its sampling decision", async () => {
    // docs/client-protocol.md: a client's traceparent is continued by every message of the turn.
    const s = await client.openSession();
    const trace = randomUUID().replace(/-/g, "");
    for (const [turn, flags] of [["t1", "01"], ["t2", "00"]]) {
      const span = randomUUID().replace(/-/g, "").slice(0, 16);
      await s.submitTurn(turn, "traced", { traceparent: `00-${trace}-${span}-${flags}` });
      const [reply] = await collect(s.turnEvents(turn, WAIT));
      const [version, traceId, spanId, gotFlags] = (reply.traceparent ?? "").split("-");
      assert.deepEqual([version, traceId, gotFlags], ["00", trace, flags], reply.traceparent ?? "none");
      assert.ok(spanId.length === 16 && spanId !== "0".repeat(16));
    }
  });

  test("a tool round trip, then a streamed follow-up", async () => {
    const s = await client.openSession();
    await s.submitTurn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})', { stream: true });
    const first = await collect(s.turnEvents("t1", WAIT));
    const calls = first[first.length - 1];
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body));
    if (calls.type !== "tool_calls") return;
    assert.equal(calls.final, false);
    assert.equal(calls.step, 0);
    assert.deepEqual(calls.calls.map((c) => c.name), ["read_file"]);
    assert.deepEqual(JSON.parse(calls.calls[0].argumentsJson), { path: "src/lib.rs" });
    assert.ok(first.slice(0, -1).every((e) => e.type === "delta" && e.step === 0));
    assert.ok(calls.traceparent, "traceparent on every reply");

    await s.submitToolResults("t1", calls.calls.map((c) => ToolResult.ok(c, { contents: "pub fn answer() -> u32 { 42 }" }, 3)));
    const second = await collect(s.turnEvents("t1", WAIT));
    const final = asFinal(second[second.length - 1]);
    const deltas = second.slice(0, -1) as Delta[];
    assert.equal(final.step, 1);
    assert.equal(final.messageId, `reply:${s.sessionId}:t1:step-1`);
    assert.ok(final.text.includes(`tool_output ${calls.calls[0].toolCallId}`), final.text);
    assert.ok(deltas.length >= 3);
    assert.ok(deltas.every((d) => d.type === "delta" && d.step === 1));
    assert.deepEqual(deltas.map((d) => d.seq), deltas.map((_, i) => i));
    assert.equal(deltas.map((d) => d.text).join(""), final.text);
    for (const d of deltas) {
      assert.equal(d.messageId, `delta:${s.sessionId}:t1:1:${d.seq}`);
    }
    assert.equal(final.traceparent?.split("-")[1], calls.traceparent?.split("-")[1], "one trace per turn");
  });

  test("a duplicate gets the stored reply without a second LLM call", async () => {
    const marker = `dup-${randomUUID()}`;
    const s = await client.openSession();
    await s.submitTurn("t1", marker);
    const first = asFinal(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(await llmCallsMentioning(marker), 1);
    await s.submitTurn("t1", marker);
    const second = asFinal(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(second.resent, true);
    assert.deepEqual(second.body, first.body);
    assert.ok(second.messageId.startsWith(`reply:${s.sessionId}:t1:resent-`));
    assert.equal(await llmCallsMentioning(marker), 1, "a duplicate must not call the LLM");
  });

  test("a conflict is refused", async () => {
    const s = await client.openSession();
    asFinal(await s.runTurn("t1", "the original", WAIT));
    await s.submitTurn("t1", "something else");
    const reply = await s.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(reply.type, "refused", JSON.stringify(reply.body));
    if (reply.type !== "refused") return;
    assert.equal(reply.code, "turn.conflict");
    assert.ok(reply.messageId.startsWith(`reply:${s.sessionId}:t1:conflict-`));
    await s.submitTurn("t1", "the original");
    asFinal(await s.nextEvent({ ...WAIT, turnId: "t1" }));
  });

  test("validation refusals", async () => {
    const s = await client.openSession(); // a session the server has never seen
    await s.submit({ SessionId: s.sessionId, TurnId: "t1", Instruction: "x", Mode: "DDR" }, { validate: false });
    const r1 = await s.nextEvent(WAIT);
    assert.equal(r1.type, "refused", JSON.stringify(r1.body));
    if (r1.type !== "refused") return;
    assert.equal(r1.code, "request.forbidden_field");
    assert.equal(r1.turnId, "t1");
    await s.submit({ SessionId: s.sessionId, TurnId: "turn 2", Instruction: "x" }, { validate: false });
    const r2 = await s.nextEvent(WAIT);
    assert.equal(r2.type === "refused" && r2.code, "validation.turn_id_invalid");
    assert.equal(r2.turnId, null);
    assert.ok(r2.messageId.startsWith(`reply:${s.sessionId}:-:rejected-`));
    asFinal(await s.runTurn("t1", "now valid", WAIT));
  });

  test("20 sessions x 5 turns at once: every reply exactly once, in order", async () => {
    const sessions = await Promise.all(Array.from({ length: 20 }, () => client.openSession()));
    for (let turn = 0; turn < 5; turn++) {
      await Promise.all(sessions.map((s) => s.submitTurn(`t${turn}`, `question ${turn} of ${s.sessionId}`)));
    }
    await Promise.all(
      sessions.map(async (s) => {
        const finals: Final[] = [];
        while (finals.length < 5) finals.push(asFinal(await s.nextEvent(WAIT)));
        assert.deepEqual(finals.map((f) => f.turnId), ["t0", "t1", "t2", "t3", "t4"], `order in ${s.sessionId}`);
        const keys = new Set(finals.map((f) => `${f.sessionId}/${f.turnId}`));
        assert.equal(keys.size, 5);
        finals.forEach((f, i) => {
          assert.ok(f.text.split("\n").includes(`instruction: question ${i} of ${s.sessionId}`), f.text);
          assert.ok(f.text.includes(`chain_depth: ${i + 1}`), "turns of a session ran one at a time, in order");
        });
        await assert.rejects(s.nextEvent({ timeoutMs: 300 }), /no event/);
        assert.equal(s.duplicatesDropped, 0, "the broker delivered a reply twice");
      }),
    );
  });

  test("every received reply is stored as received", { skip: process.env.APTIX_TEST_BIN ? false : "APTIX_TEST_BIN names no aptix binary" }, async () => {
    const s = await client.openSession();
    const received: AptixEvent[] = [];
    await s.submit({ SessionId: s.sessionId, TurnId: "t0", Instruction: "x", Mode: "DDR" }, { validate: false });
    received.push(await s.nextEvent(WAIT));
    await s.runTurn("t1", "tools @call(run_tests)", { ...WAIT, onEvent: (e) => received.push(e), tools: (c) => ToolResult.error(c, "no tests matched", 2) });
    await s.submitTurn("t1", "tools @call(run_tests)"); // duplicate
    received.push(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    await s.submitTurn("t1", "other"); // conflict
    received.push(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    const replies = new Map(received.filter((e) => e.type !== "delta").map((e) => [e.messageId, e]));
    assert.equal(replies.size, 5, [...replies.keys()].join(" "));
    const shown = JSON.parse(execFileSync(process.env.APTIX_TEST_BIN!, ["session", "show", s.sessionId], { encoding: "utf8" }));
    // Step replies are in `records` (by turn and step), the others in `replies`.
    const stored = new Map<string, unknown>();
    for (const r of shown.replies as { message_id: string; body: unknown; outcome: string }[]) {
      stored.set(r.message_id, r.body);
      assert.equal(r.outcome, (replies.get(r.message_id) as Reply | undefined)?.outcome, r.message_id);
    }
    for (const r of shown.records as { turn_id: string; step: number; reply: unknown }[]) {
      stored.set(`reply:${s.sessionId}:${r.turn_id}:step-${r.step}`, r.reply);
    }
    assert.deepEqual([...stored.keys()].sort(), [...replies.keys()].sort());
    for (const [id, e] of replies) assert.deepEqual(stored.get(id), e.body, id);
  });
});

describe("real pipeline: replies per instance (§4a)", { skip: ready ? false : "no pipeline: run clients/run-tests.sh" }, () => {
  const opened: Client[] = [];
  const schemas = ready ? new Schemas(findSchemasDir(__dirname)!) : undefined;

  /** A client in instance mode, with a fresh instance name; its queue is deleted after. */
  async function openInstance(): Promise<Client> {
    const c = await Client.connect({ url: URL, prefix: PREFIX, instance: `ts-${randomUUID().slice(0, 12)}`, schemas, strict: true });
    opened.push(c);
    return c;
  }

  after(async () => {
    for (const c of opened) {
      await c.instance?.deleteQueue().catch(() => undefined);
      await c.close();
    }
  });

  test("10 sessions x 3 turns on one instance queue: every turn once, in order, no session queue", async () => {
    const c = await openInstance();
    const queue = c.instance!.queue;
    const sessions = await Promise.all(Array.from({ length: 10 }, () => c.openSession()));
    const subs = await Promise.all(
      sessions.flatMap((s) => [0, 1, 2].map((turn) => ({ s, turn }))).sort((x, y) => x.turn - y.turn)
        .map(({ s, turn }) => s.submitTurn(`t${turn}`, `instance question ${turn} of ${s.sessionId}`)),
    );
    assert.ok(subs.every((sub) => sub.replyTo === queue));
    await Promise.all(
      sessions.map(async (s) => {
        const finals: Final[] = [];
        while (finals.length < 3) finals.push(asFinal(await s.nextEvent(WAIT)));
        assert.deepEqual(finals.map((f) => f.turnId), ["t0", "t1", "t2"], `order in ${s.sessionId}`);
        finals.forEach((f, i) => {
          assert.equal(f.sessionId, s.sessionId);
          assert.equal(f.headers["x-aptix-session-id"], s.sessionId);
          assert.equal(f.headers[H_PROTOCOL], PROTOCOL_VERSION, "the server speaks the version this client is for");
          assert.equal(f.messageId, `reply:${s.sessionId}:t${i}:step-0`);
          assert.ok(f.text.split("\n").includes(`instruction: instance question ${i} of ${s.sessionId}`), f.text);
          assert.ok(f.text.includes(`chain_depth: ${i + 1}`), "turns of a session ran one at a time, in order");
        });
        await assert.rejects(s.nextEvent({ timeoutMs: 300 }), /no event/);
        assert.equal(s.duplicatesDropped, 0, "the broker delivered a reply twice");
      }),
    );
    assert.deepEqual(c.instance!.pendingSessions(), []);
    assert.deepEqual(c.instance!.unroutable, []);
    for (const s of sessions) {
      assert.equal(await queueExists(URL, sessionQueue(PREFIX!, s.sessionId)), false, `a session queue was created for ${s.sessionId}`);
    }
    assert.equal(await queueExists(URL, queue), true);
  });

  test("a tool round trip on the instance queue", async () => {
    const c = await openInstance();
    const s = await c.openSession();
    await s.submitTurn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})', { stream: true });
    const first = await collect(s.turnEvents("t1", WAIT));
    const calls = first[first.length - 1];
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body));
    if (calls.type !== "tool_calls") return;
    assert.equal(calls.step, 0);
    assert.deepEqual(calls.calls.map((x) => x.name), ["read_file"]);
    assert.ok(first.slice(0, -1).every((e) => e.type === "delta" && e.step === 0));

    const sub = await s.submitToolResults("t1", calls.calls.map((x) => ToolResult.ok(x, { contents: "pub fn answer() -> u32 { 42 }" }, 3)));
    assert.equal(sub.replyTo, c.instance!.queue);
    const second = await collect(s.turnEvents("t1", WAIT));
    const final = asFinal(second[second.length - 1]);
    const deltas = second.slice(0, -1) as Delta[];
    assert.equal(final.step, 1);
    assert.equal(final.messageId, `reply:${s.sessionId}:t1:step-1`);
    assert.ok(final.text.includes(`tool_output ${calls.calls[0].toolCallId}`), final.text);
    assert.ok(deltas.length >= 3 && deltas.every((d) => d.type === "delta" && d.step === 1));
    assert.deepEqual(deltas.map((d) => d.seq), deltas.map((_, i) => i));
    assert.equal(deltas.map((d) => d.text).join(""), final.text);
    await assert.rejects(s.nextEvent({ timeoutMs: 500 }), /no event/);
    assert.equal(await queueExists(URL, sessionQueue(PREFIX!, s.sessionId)), false);
  });

  test("the next step goes to the instance that submitted the results", async () => {
    const [a, b] = [await openInstance(), await openInstance()];
    const onA = await a.openSession();
    await onA.submitTurn("t1", "tools @call(run_tests)");
    const calls = await onA.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body));
    if (calls.type !== "tool_calls") return;

    const onB = await b.openSession(onA.sessionId); // another instance takes the session over
    const sub = await onB.submitToolResults("t1", calls.calls.map((x) => ToolResult.error(x, "no tests matched", 2)));
    assert.equal(sub.replyTo, b.instance!.queue);
    const final = asFinal(await onB.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(final.step, 1);
    await assert.rejects(onA.nextEvent({ timeoutMs: 1000 }), /no event/);

    await onA.submitTurn("t1", "tools @call(run_tests)"); // a duplicate, submitted through a
    const resent = asFinal(await onA.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(resent.resent, true);
    assert.deepEqual(resent.body, final.body);
    await assert.rejects(onB.nextEvent({ timeoutMs: 500 }), /no event/);
    assert.equal(await queueExists(URL, sessionQueue(PREFIX!, onA.sessionId)), false);
  });

  test("a reply_to that names no reply queue is refused with request.reply_to_invalid", async () => {
    const c = await Client.connect({ url: URL, prefix: PREFIX, schemas, strict: true });
    opened.push(c);
    const s = await c.openSession(); // per session: the refusal comes to the declared session queue
    const bad = [
      `${PREFIX}.requests`,
      sessionQueue(PREFIX!, randomUUID()), // another session's queue
      `${PREFIX}.instance.`, // no instance name
      `${PREFIX}.instance.${"x".repeat(65)}`, // a name too long
      `${PREFIX}.instance.bad name`, // a character outside [A-Za-z0-9._-]
      `other-${PREFIX}.instance.pod-1`, // another deployment's instance queue
    ];
    for (const replyTo of bad) {
      const sub = await s.submit({ SessionId: s.sessionId, TurnId: "t1", Instruction: "x" }, { replyTo });
      const r = await s.nextEvent(WAIT);
      assert.equal(r.type, "refused", `${replyTo}: ${JSON.stringify(r.body)}`);
      if (r.type !== "refused") return;
      assert.equal(r.code, CODE_REPLY_TO_INVALID, replyTo);
      assert.equal(r.turnId, "t1");
      assert.equal(r.correlationId, sub.messageId);
      assert.ok(r.messageId.startsWith(`reply:${s.sessionId}:t1:rejected-`), r.messageId);
    }

    // RabbitMQ's direct reply-to: the publishing channel consumes `amq.rabbitmq.reply-to` (else
    // the broker closes it), and the server receives `amq.rabbitmq.reply-to.<token>`.
    const conn = await amqp.connect(URL);
    const messageId = randomUUID();
    try {
      const ch = await conn.createConfirmChannel();
      await ch.consume("amq.rabbitmq.reply-to", () => undefined, { noAck: true });
      const body = Buffer.from(JSON.stringify({ SessionId: s.sessionId, TurnId: "t1", Instruction: "x" }));
      ch.publish(`${PREFIX}.requests`, s.sessionId, body, {
        contentType: "application/json", deliveryMode: 2, messageId, replyTo: "amq.rabbitmq.reply-to", mandatory: true,
      });
      await ch.waitForConfirms();
    } finally {
      await conn.close();
    }
    const r = await s.nextEvent(WAIT);
    assert.equal(r.type === "refused" && r.code, CODE_REPLY_TO_INVALID, JSON.stringify(r.body));
    assert.equal(r.correlationId, messageId);

    // Nothing changed: the session's own queue as reply_to is the default, and t1 still starts.
    await s.submit({ SessionId: s.sessionId, TurnId: "t1", Instruction: "now valid" }, { replyTo: s.queue });
    const final = asFinal(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(final.messageId, `reply:${s.sessionId}:t1:step-0`);
  });
});

/**
 * Submits `turnId` with a long streamed answer, then `meanwhile()`, and returns once the turn
 * streams text: with the simulator's 100 ms between events it streams for about 4 s more.
 */
async function streamingTurn(s: Session, turnId: string, meanwhile: () => Promise<void>): Promise<void> {
  const long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail ".repeat(30);
  await s.submitTurn(turnId, long, { stream: true });
  await meanwhile();
  for (;;) {
    const d = await s.nextEvent({ ...WAIT, turnId });
    assert.equal(d.type, "delta", JSON.stringify(d.body));
    if (d.type === "delta" && d.text !== "") return;
  }
}

describe("real pipeline: cancelling a turn (§7a)", { skip: ready ? false : "no pipeline: run clients/run-tests.sh" }, () => {
  let client: Client;
  before(async () => {
    client = await Client.connect({ url: URL, prefix: PREFIX, schemas: new Schemas(findSchemasDir(__dirname)!), strict: true });
  });
  after(() => client.close());

  test("a queued and a streaming turn are cancelled, then the next turn runs", async () => {
    // The simulator waits 100 ms between stream events while this test runs (other tests share
    // it): t1's answer (about 40 text deltas: the simulator echoes only the instruction's first
    // 120 characters) then streams for about 4 s, well past the two cancels.
    await simControl({ command: "set_latency", latency: { per_event_ms: 100 } });
    try {
      const s = await client.openSession();
      const sid = s.sessionId;
      // t1 runs and streams; t2 and t3 wait behind it
      await streamingTurn(s, "t1", async () => {
        await s.submitTurn("t2", "queued, then cancelled");
        await s.submitTurn("t3", "runs after both");
      });

      const c2 = await s.cancelTurn("t2");
      assert.equal(c2.type, "turn.cancel");
      const t2 = asFailed(await s.nextEvent({ ...WAIT, turnId: "t2" }));
      assert.deepEqual([t2.code, t2.outcome, t2.final, t2.step], [CODE_TURN_CANCELLED, "failed", true, 0]);
      assert.equal(t2.messageId, `reply:${sid}:t2:step-0`);

      await s.cancelTurn("t1");
      const rest = await collect(s.turnEvents("t1", WAIT));
      const t1 = asFailed(rest[rest.length - 1]);
      assert.deepEqual([t1.code, t1.final, t1.step], [CODE_TURN_CANCELLED, true, 0]);
      assert.equal(t1.messageId, `reply:${sid}:t1:step-0`);
      assert.ok(rest.slice(0, -1).every((e) => e.type === "delta" && e.turnId === "t1"));

      const t3 = await collect(s.turnEvents("t3", WAIT));
      assert.equal(t3.length, 1);
      assert.ok(asFinal(t3[0]).text.split("\n").includes("instruction: runs after both"), asFinal(t3[0]).text);
      // Nothing else came: no delta of t1 after its reply.
      await assert.rejects(s.nextEvent({ timeoutMs: 1000 }), /no event/);

      const finished = await s.cancelTurn("t3");
      await s.cancelTurn("t2"); // already cancelled: no answer
      const unknown = await s.cancelTurn("nope");
      const r3 = asRefused(await s.nextEvent({ ...WAIT, turnId: "t3" }));
      assert.deepEqual([r3.code, r3.outcome, r3.final], [CODE_TURN_FINISHED, "refused", true]);
      assert.ok(r3.messageId.includes(`reply:${sid}:t3:rejected-cancel-`), r3.messageId);
      assert.equal(r3.correlationId, finished.messageId);
      const rn = asRefused(await s.nextEvent({ ...WAIT, turnId: "nope" }));
      assert.equal(rn.code, CODE_TURN_NOT_FOUND);
      assert.ok(rn.messageId.startsWith(`reply:${sid}:nope:rejected-cancel-`), rn.messageId);
      assert.equal(rn.correlationId, unknown.messageId);
      // The repeated cancel of t2 got nothing.
      await assert.rejects(s.nextEvent({ timeoutMs: 2000 }), /no event/);
    } finally {
      await simControl({ command: "set_latency", latency: {} });
    }
  });

  test("a turn waiting for tool results is cancelled; its late results are refused", async () => {
    const s = await client.openSession();
    const sid = s.sessionId;
    await s.submitTurn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})');
    const calls = await s.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body));
    if (calls.type !== "tool_calls") return;
    assert.equal(calls.step, 0);

    await s.cancelTurn("t1");
    const ended = asFailed(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.deepEqual([ended.code, ended.final, ended.step], [CODE_TURN_CANCELLED, true, 1]);
    assert.equal(ended.messageId, `reply:${sid}:t1:step-1`);

    const late = await s.submitToolResults("t1", calls.calls.map((c) => ToolResult.ok(c, { contents: "too late" }, 3)));
    const refused = asRefused(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(refused.code, CODE_TOOL_RESULTS_TURN_CANCELLED, JSON.stringify(refused.errors));
    assert.ok(refused.messageId.startsWith(`reply:${sid}:t1:rejected-continuation-`), refused.messageId);
    assert.equal(refused.correlationId, late.messageId);

    // The session is free again: the next turn runs.
    asFinal(await s.runTurn("t2", "after the cancel", WAIT));
  });

  test("a follow-up steers the turn waiting for tool results (§11, steer)", async () => {
    const s = await client.openSession();
    const sid = s.sessionId;
    await s.submitTurn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})');
    const calls = await s.nextEvent({ ...WAIT, turnId: "t1" });
    assert.equal(calls.type, "tool_calls", JSON.stringify(calls.body));
    if (calls.type !== "tool_calls") return;

    await s.submitTurn("t2", "also name the first function", { fields: { FollowUp: "steer" } });
    await s.submitToolResults("t1", calls.calls.map((c) => ToolResult.ok(c, { contents: "fn main() {}" }, 3)));
    const t1 = asFinal(await s.nextEvent({ ...WAIT, turnId: "t1" }));
    assert.equal(t1.steered, false);
    // The model read t2's instruction last: the simulator answers the newest one.
    assert.ok(t1.text.split("\n").includes("instruction: also name the first function"), t1.text);
    const t2 = asFinal(await s.nextEvent({ ...WAIT, turnId: "t2" }));
    assert.equal(t2.steered, true);
    assert.deepEqual(t2.warnings.map((w) => w.code), [CODE_TURN_STEERED]);
    assert.deepEqual([t2.messageId, t2.text, t2.result.Usage], [`reply:${sid}:t2:step-0`, t1.text, undefined]);

    // A steer with a file is refused; with no turn running, a steer simply runs.
    await s.submit({
      SessionId: sid, TurnId: "t3", Instruction: "this file", FollowUp: "steer",
      InputArtifacts: [{ RelativePath: "src/a.rs", FileName: "a.rs", Contents: "fn a() {}", Origin: "ide" }],
    });
    const refused = asRefused(await s.nextEvent({ ...WAIT, turnId: "t3" }));
    assert.equal(refused.code, "validation.follow_up_invalid");
    const t4 = asFinal(await s.runTurn("t4", "now this", { ...WAIT, fields: { FollowUp: "steer" } }));
    assert.equal(t4.steered, false);
  });

  test("a follow-up chooses its policy per request (§11)", async () => {
    await simControl({ command: "set_latency", latency: { per_event_ms: 100 } });
    try {
      const s = await client.openSession();
      const sid = s.sessionId;
      await streamingTurn(s, "t1", async () => {});

      await s.submitTurn("t2", "refused while t1 runs", { fields: { FollowUp: "reject" } });
      const busy = asRefused(await s.nextEvent({ ...WAIT, turnId: "t2" }));
      assert.equal(busy.code, CODE_SESSION_BUSY);
      assert.ok(busy.messageId.startsWith(`reply:${sid}:t2:rejected-busy-`), busy.messageId);
      // The request schema lists the three; the server refuses another on its own, too.
      await s.submit({ SessionId: sid, TurnId: "t3", Instruction: "a policy nobody knows", FollowUp: "soon" }, { validate: false });
      const invalid = asRefused(await s.nextEvent({ ...WAIT, turnId: "t3" }));
      assert.equal(invalid.code, "validation.follow_up_invalid");

      await s.submitTurn("t4", "stop that and answer this", { fields: { FollowUp: "interrupt" } });
      const rest = await collect(s.turnEvents("t1", WAIT));
      assert.equal(asFailed(rest[rest.length - 1]).code, CODE_TURN_CANCELLED);
      const t4 = await collect(s.turnEvents("t4", WAIT));
      assert.equal(t4.length, 1);
      assert.ok(asFinal(t4[0]).text.split("\n").includes("instruction: stop that and answer this"));
      // t2 was refused, not stored: the same TurnId runs now that the session is idle.
      asFinal(await s.runTurn("t2", "refused while t1 runs", WAIT));
    } finally {
      await simControl({ command: "set_latency", latency: {} });
    }
  });
});
