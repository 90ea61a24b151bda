/**
 * The AMQP side: a `Client` (one amqplib connection) and its `Session`s (one confirm channel
 * each). A session follows protocol v2's reply-queue procedure literally: open a channel with
 * publisher confirms, declare `<prefix>.session.<SessionId>` durable with no arguments, consume
 * it with manual acks, then publish requests to the `<prefix>.requests` exchange (routing key =
 * SessionId, persistent, JSON, a fresh message_id, mandatory) and wait for each confirm.
 */

import { randomUUID } from "node:crypto";
import * as amqp from "amqplib";
import type { ConfirmChannel, ConsumeMessage, MessageProperties } from "amqplib";

import { AptixEvent, Final, Failed, Refused, Reply, ToolCall, ToolResult, parseEvent } from "./events";
import { CONTENT_TYPE, H_TRACEPARENT, ProtocolError, isSessionId, requestsExchange, sessionQueue } from "./protocol";
import { Schemas, findSchemasDir } from "./schemas";

export const DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f";

type Connection = Awaited<ReturnType<typeof amqp.connect>>;
type Json = Record<string, unknown>;

/** One message as sent ("out") or accepted ("in"): for logs and wire captures. */
export interface WireMessage {
  exchange?: string;
  routingKey?: string;
  mandatory?: boolean;
  queue?: string;
  properties: Record<string, unknown>;
  headers: Record<string, unknown>;
  body: unknown;
}

export interface ClientOptions {
  url?: string;
  prefix?: string;
  /** A Schemas, a directory, `true` to look for one (findSchemasDir), or nothing for no checks. */
  schemas?: Schemas | string | boolean;
  /** Check reply headers against protocol v2, types included (default true). */
  strict?: boolean;
  wireLog?: (direction: "in" | "out", message: WireMessage) => void;
}

/** The broker did not take a request: returned as unroutable, or nacked. */
export class PublishError extends Error {
  override name = "PublishError";
}

/** No event arrived in time. */
export class EventTimeout extends Error {
  override name = "EventTimeout";
}

/** A request the broker confirmed. */
export interface Submission {
  messageId: string;
  sessionId: string;
  turnId: string | null;
  body: unknown;
}

export interface SubmitOptions {
  messageId?: string;
  traceparent?: string;
  /** Check the body against the request schema first (default true, when schemas are loaded). */
  validate?: boolean;
}

export type ToolHandler = (call: ToolCall) => ToolResult | Promise<ToolResult>;

/** One connection to RabbitMQ for one Aptix deployment (its queue-name prefix). */
export class Client {
  private readonly sessions = new Set<Session>();

  private constructor(
    readonly conn: Connection,
    readonly prefix: string,
    readonly schemas: Schemas | null,
    readonly strict: boolean,
    readonly wireLog: ClientOptions["wireLog"],
  ) {}

  static async connect(opts: ClientOptions = {}): Promise<Client> {
    const schemas = loadSchemas(opts.schemas);
    const conn = await amqp.connect(opts.url ?? DEFAULT_URL);
    return new Client(conn, opts.prefix ?? "aptix", schemas, opts.strict ?? true, opts.wireLog);
  }

  /** Declares and consumes the session's reply queue; a new SessionId when none is given. */
  async openSession(sessionId: string = randomUUID()): Promise<Session> {
    if (!isSessionId(sessionId)) throw new Error(`SessionId must be a UUID, got ${sessionId}`);
    const s = new Session(this, sessionId, await this.conn.createConfirmChannel());
    await s.start();
    this.sessions.add(s);
    return s;
  }

  /** @internal */
  forget(s: Session): void {
    this.sessions.delete(s);
  }

  async close(): Promise<void> {
    for (const s of [...this.sessions]) await s.close();
    await this.conn.close();
  }
}

function loadSchemas(s: ClientOptions["schemas"]): Schemas | null {
  if (s instanceof Schemas) return s;
  if (s === true) {
    const dir = findSchemasDir();
    if (!dir) throw new Error("no schemas/ directory found; set APTIX_SCHEMAS_DIR");
    return new Schemas(dir);
  }
  return typeof s === "string" ? new Schemas(s) : null;
}

type Item = { msg: ConsumeMessage; event?: AptixEvent; error?: Error };

/**
 * One session: its reply queue, requests to it, and the typed events read from it. Events are
 * deduplicated by message_id. A message is acked once the application has handled it, that is
 * when it asks for the next event (or closes the session); messages not yet handed out go back
 * to the queue if the channel closes.
 */
export class Session {
  readonly queue: string;
  readonly seen = new Set<string>();
  duplicatesDropped = 0;
  private readonly inbox: Item[] = [];
  private handled: ConsumeMessage[] = [];
  private readonly returned = new Set<string>();
  private wake: (() => void)[] = [];
  private failure: Error | null = null;
  /** The calls each turn waits for (from its latest tool_calls), to order results by. */
  readonly pendingCalls = new Map<string, string[]>();

  constructor(
    readonly client: Client,
    readonly sessionId: string,
    private readonly ch: ConfirmChannel,
  ) {
    this.queue = sessionQueue(client.prefix, sessionId);
  }

  /** @internal the documented procedure: declare (durable, no arguments), then consume. */
  async start(): Promise<void> {
    this.ch.on("return", (m: { properties: MessageProperties }) => {
      if (m.properties.messageId) this.returned.add(String(m.properties.messageId));
    });
    const fail = (e?: Error) => {
      this.failure ??= e ?? new Error(`channel of ${this.queue} closed`);
      this.notify();
    };
    this.ch.on("error", fail);
    this.ch.on("close", () => fail());
    await this.ch.assertQueue(this.queue, { durable: true, arguments: {} });
    await this.ch.consume(this.queue, (m) => m && this.onMessage(m), { noAck: false });
  }

  /** Publishes a user turn; other AGN-034 properties go in `fields`, in PascalCase. */
  submitTurn(
    turnId: string,
    instruction?: string,
    opts: SubmitOptions & { stream?: boolean; fields?: Json } = {},
  ): Promise<Submission> {
    const body: Json = { SessionId: this.sessionId, TurnId: turnId };
    if (instruction !== undefined) body.Instruction = instruction;
    if (opts.stream !== undefined) body.Stream = opts.stream;
    Object.assign(body, opts.fields ?? {});
    return this.submit(body, opts);
  }

  /**
   * Publishes a tool-result continuation. When this session received the turn's tool_calls,
   * `results` must answer exactly those calls (an Error otherwise) and are sent in the order of
   * the calls, whatever their order here.
   */
  async submitToolResults(turnId: string, results: ToolResult[], opts: SubmitOptions = {}): Promise<Submission> {
    const ordered = this.inCallOrder(turnId, results);
    const body = { SessionId: this.sessionId, TurnId: turnId, ToolResults: ordered.map(ToolResult.toWire) };
    return this.submit(body, opts);
  }

  private inCallOrder(turnId: string, results: ToolResult[]): ToolResult[] {
    const expected = this.pendingCalls.get(turnId);
    if (!expected) return results;
    const byId = new Map(results.map((r) => [r.toolCallId, r]));
    const same = byId.size === results.length && results.length === expected.length && expected.every((id) => byId.has(id));
    if (!same) {
      throw new Error(`turn ${turnId} waits for results of ${expected.join(", ")}, got ${results.map((r) => r.toolCallId).join(", ")}`);
    }
    return expected.map((id) => byId.get(id) as ToolResult);
  }

  /**
   * Publishes any request body (an object, or a Buffer sent as it is) and waits for the broker's
   * confirm. To re-send the same submission, pass its messageId again.
   */
  async submit(body: Json | Buffer, opts: SubmitOptions = {}): Promise<Submission> {
    const raw = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const parsed: unknown = Buffer.isBuffer(body) ? maybeJson(body) : body;
    if ((opts.validate ?? true) && this.client.schemas && !Buffer.isBuffer(body)) {
      this.client.schemas.checkRequest(body);
    }
    const messageId = opts.messageId ?? randomUUID();
    const headers = opts.traceparent ? { [H_TRACEPARENT]: opts.traceparent } : undefined;
    const exchange = requestsExchange(this.client.prefix);
    const props = { contentType: CONTENT_TYPE, deliveryMode: 2, messageId, headers, mandatory: true };
    await new Promise<void>((resolve, reject) => {
      this.ch.publish(exchange, this.sessionId, raw, props, (err) => {
        // RabbitMQ sends basic.return before the ack of the same message; match by message_id.
        if (err) reject(new PublishError(`the broker nacked request ${messageId}`));
        else if (this.returned.delete(messageId)) reject(new PublishError(`${exchange} returned request ${messageId} as unroutable`));
        else resolve();
      });
    });
    this.client.wireLog?.("out", {
      exchange,
      routingKey: this.sessionId,
      mandatory: true,
      properties: { message_id: messageId, content_type: CONTENT_TYPE, delivery_mode: 2 },
      headers: headers ?? {},
      body: parsed,
    });
    const turn = (parsed as Json | null)?.TurnId;
    return { messageId, sessionId: this.sessionId, turnId: typeof turn === "string" ? turn : null, body: parsed };
  }

  private onMessage(msg: ConsumeMessage): void {
    const p = msg.properties;
    const id = p.messageId ? String(p.messageId) : "";
    if (id && this.seen.has(id)) {
      this.duplicatesDropped++;
      this.ch.ack(msg);
      return;
    }
    try {
      const event = parseEvent(
        { type: p.type, messageId: p.messageId, correlationId: p.correlationId, headers: p.headers, body: msg.content },
        this.client.strict,
      );
      const schemas = this.client.schemas;
      if (schemas) {
        if (event.type === "delta") schemas.checkDelta(event.body, id);
        else schemas.checkReply(event.body, id);
      }
      if (event.sessionId !== this.sessionId) {
        throw new ProtocolError(`${id} names session ${event.sessionId} on ${this.queue}`);
      }
      if (id) this.seen.add(id);
      if (event.type === "tool_calls" && event.turnId) this.pendingCalls.set(event.turnId, event.calls.map((c) => c.toolCallId));
      else if ((event.type === "final" || event.type === "failed") && event.turnId) this.pendingCalls.delete(event.turnId);
      this.client.wireLog?.("in", { queue: this.queue, properties: wireProps(p), headers: { ...(p.headers ?? {}) }, body: event.body });
      this.inbox.push({ msg, event });
    } catch (e) {
      this.inbox.push({ msg, error: e as Error });
    }
    this.notify();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = [];
    for (const f of w) f();
  }

  private ackHandled(): void {
    if (this.failure) return;
    for (const m of this.handled) this.ch.ack(m);
    this.handled = [];
  }

  /**
   * The next event (of `turnId` only, when given; others stay queued in order). Rejects with
   * EventTimeout, or with the ProtocolError / SchemaError of a message that broke the protocol
   * (that message is acked: it is stored server-side).
   */
  async nextEvent(opts: { timeoutMs?: number; turnId?: string } = {}): Promise<AptixEvent> {
    this.ackHandled();
    const deadline = Date.now() + (opts.timeoutMs ?? 60_000);
    for (;;) {
      const i = this.inbox.findIndex((it) => opts.turnId === undefined || it.error || it.event?.turnId === opts.turnId);
      if (i >= 0) {
        const [it] = this.inbox.splice(i, 1);
        this.handled.push(it.msg);
        if (it.error) throw it.error;
        return it.event as AptixEvent;
      }
      if (this.failure) throw this.failure;
      const left = deadline - Date.now();
      if (left <= 0) throw new EventTimeout(`no event for ${opts.turnId ?? "the session"} within ${opts.timeoutMs ?? 60_000} ms`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.wake.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /**
   * Events of one turn up to and including its next reply: `final` / `failed` (the turn is
   * over), `refused` (that submission was refused), or `tool_calls` (the step is over: submit
   * the results, then iterate again for the next step).
   */
  async *turnEvents(turnId: string, opts: { timeoutMs?: number } = {}): AsyncGenerator<AptixEvent> {
    for (;;) {
      const e = await this.nextEvent({ ...opts, turnId });
      yield e;
      if (e.type !== "delta") return;
    }
  }

  /**
   * Submits a user turn and drives it to its end: runs every requested tool call through `tools`
   * (in order), submits the results, and returns the final reply (Final, Failed or Refused).
   */
  async runTurn(
    turnId: string,
    instruction: string | undefined,
    opts: {
      tools?: ToolHandler;
      onEvent?: (e: AptixEvent) => void;
      timeoutMs?: number;
      stream?: boolean;
      fields?: Json;
    } = {},
  ): Promise<Final | Failed | Refused> {
    await this.submitTurn(turnId, instruction, { stream: opts.stream, fields: opts.fields });
    for (;;) {
      let next: Reply | null = null;
      for await (const e of this.turnEvents(turnId, opts)) {
        opts.onEvent?.(e);
        if (e.type !== "delta") next = e;
      }
      if (next === null) throw new Error(`turn ${turnId} ended without a reply`);
      if (next.type !== "tool_calls") return next;
      if (!opts.tools) throw new Error(`turn ${turnId} asks for tools and no handler was given`);
      const results: ToolResult[] = [];
      for (const c of next.calls) results.push(await opts.tools(c));
      await this.submitToolResults(turnId, results);
    }
  }

  /** Acks handled messages and closes the channel; unread messages stay on the queue. */
  async close(): Promise<void> {
    this.client.forget(this);
    if (this.failure) return;
    this.ackHandled();
    this.failure = new Error("session closed");
    await this.ch.close();
  }

  /** Deletes the reply queue (the server re-creates it for the next admitted turn). */
  async deleteQueue(): Promise<void> {
    await this.ch.deleteQueue(this.queue);
  }
}

function maybeJson(raw: Buffer): unknown {
  try {
    return JSON.parse(raw.toString());
  } catch {
    return raw.toString();
  }
}

function wireProps(p: MessageProperties): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const names: [keyof MessageProperties, string][] = [
    ["type", "type"],
    ["messageId", "message_id"],
    ["correlationId", "correlation_id"],
    ["contentType", "content_type"],
    ["deliveryMode", "delivery_mode"],
  ];
  for (const [k, n] of names) if (p[k] !== undefined) out[n] = p[k];
  return out;
}
