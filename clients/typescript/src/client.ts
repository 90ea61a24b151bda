/**
 * The AMQP side: a `Client` (one amqplib connection) and its `Session`s (one confirm channel
 * each). A session follows protocol v3's reply-queue procedure literally: open a channel with
 * publisher confirms, declare `<prefix>.session.<SessionId>` durable with no arguments, consume
 * it with manual acks, then publish requests to the `<prefix>.requests` exchange (routing key =
 * SessionId, persistent, JSON, a fresh message_id, mandatory, `userId` = the URL's user) and wait
 * for each confirm.
 *
 * With `Client.connect({ instance: "I" })` the client follows §4a instead ("replies per
 * instance"): an `Instance` declares `<prefix>.instance.I` (durable, no arguments) once and
 * consumes it with manual acks on one confirm channel, every session publishes on that channel
 * with `replyTo` = that queue and declares no queue of its own, and each message goes to its
 * session by the `x-aptix-session-id` header. The sessions' API is the same.
 *
 * Tenants: every request carries the AMQP property `user_id`, the RabbitMQ user of the URL (the
 * broker refuses any other, so the server can trust it). With `Client.connect({ tenant: "T" })`
 * the reply queues carry the tenant's name: `<prefix>.session.T.<SessionId>` per session and
 * `<prefix>.instance.T.<name>` per instance (`replyTo` is that name); nothing else changes.
 *
 * Clusters: `url` may name several broker nodes (an array, or one string of comma-separated URLs,
 * like the server's `amqp.url`). The client connects to a random one first and moves on to the
 * next when one refuses or does not answer within `connectTimeoutMs`. When the connection is
 * lost it reconnects with a back-off (200 ms doubling to 5 s, reset after a long healthy
 * connection) to whichever node answers, declares its reply queues again and consumes them
 * again; messages that were delivered but not acked come again and are dropped as copies by
 * message_id (§11). A publish that is nacked, returned, or whose confirm was lost with its
 * channel or connection is sent again (same message_id, same body) on a fresh channel, up to
 * `publishAttempts` times (§4 step 4).
 */

import { randomUUID } from "node:crypto";
import * as amqp from "amqplib";
import type { ConfirmChannel, ConsumeMessage, MessageProperties } from "amqplib";

import { AptixEvent, Final, Failed, Refused, Reply, ToolCall, ToolDecision, ToolResult, parseEvent } from "./events";
import {
  CANCEL_TYPE,
  CODE_RESUMES_LIMIT,
  CODE_TURN_CONFLICT,
  CONTENT_TYPE,
  H_SESSION_ID,
  H_EVENT_SEQ,
  H_TRACEPARENT,
  KIND_RESUMED,
  LATE_DECISION_CODES,
  RESUME_TYPE,
  ProtocolError,
  checkTenantName,
  instanceQueue,
  isInstanceName,
  isSessionId,
  messageSessionId,
  requestsExchange,
  sessionQueue,
} from "./protocol";
import { Schemas, findSchemasDir } from "./schemas";

export const DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f";
/** The user amqplib connects as when a URL names none. */
export const DEFAULT_USER = "guest";
/** Milliseconds a broker node has to accept the connection and finish the AMQP handshake. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Reconnect back-off, ms: the first delay, doubled after each failed attempt up to the second. */
export const DEFAULT_RECONNECT_BACKOFF_MS: readonly [number, number] = [200, 5_000];
/** Milliseconds of reconnect attempts after a connection loss before `ConnectionLost`. */
export const DEFAULT_RECONNECT_TIMEOUT_MS = 60_000;
/** A connection that lived this long (ms) resets the reconnect back-off to its first delay. */
export const HEALTHY_AFTER_MS = 30_000;
/** Attempts of one publish (nacked, returned, or confirm lost) before `PublishError`. */
export const DEFAULT_PUBLISH_ATTEMPTS = 6;
/** Pause between publish attempts, ms: the first, doubled up to the second. */
export const PUBLISH_BACKOFF_MS: readonly [number, number] = [50, 1_000];
/**
 * Pause between attempts to declare and consume a queue the broker stopped consuming (its node
 * down, the queue deleted, the channel closed), ms: the first, doubled up to the second.
 */
export const RESTORE_BACKOFF_MS: readonly [number, number] = [100, 5_000];

/**
 * message_ids remembered per session to drop copies: the newest this many. A copy comes from a
 * redelivery of what was not acked yet or from a re-send of something recent, while a session
 * that lives for months streams millions of ids.
 */
export const SEEN_PER_SESSION = 65_536;
/** Sessions an instance remembers the ids of once they are closed (the oldest forgotten first). */
export const SEEN_CLOSED_SESSIONS = 4_096;

/** The message_ids a session handled, the newest `bound` of them (a `Set` that forgets the oldest). */
export class SeenIds extends Set<string> {
  constructor(private readonly bound: number = SEEN_PER_SESSION) {
    super();
  }

  override add(id: string): this {
    super.delete(id); // seen again: now the newest
    super.add(id);
    if (this.size > this.bound) super.delete(this.values().next().value as string);
    return this;
  }
}

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
  /**
   * One broker URL, a string of comma-separated URLs (the nodes of a cluster), or an array of
   * them (whose items may themselves be comma-separated).
   */
  url?: string | string[];
  /** Milliseconds a node has to take the connection before the next is tried (default 5000). */
  connectTimeoutMs?: number;
  /** The name the broker shows for the connection (default `aptix-client <prefix>`). */
  connectionName?: string;
  /**
   * Reconnect when the connection is lost (default true), to any node of `url`, with a back-off
   * of `reconnectBackoffMs` for up to `reconnectTimeoutMs`; then waiting calls reject with
   * `ConnectionLost`. false: the loss rejects waiting calls at once, as before.
   */
  reconnect?: boolean;
  /** First and longest delay between reconnect attempts, ms (default [200, 5000]). */
  reconnectBackoffMs?: readonly [number, number];
  /** How long to keep trying to reconnect, ms (default 60000). */
  reconnectTimeoutMs?: number;
  /**
   * How many times a request is published (same message_id) before `PublishError` when it is
   * nacked, returned, or its confirm is lost (default 6).
   */
  publishAttempts?: number;
  prefix?: string;
  /** A Schemas, a directory, `true` to look for one (findSchemasDir), or nothing for no checks. */
  schemas?: Schemas | string | boolean;
  /** Check reply headers against protocol v3, types included (default true). */
  strict?: boolean;
  wireLog?: (direction: "in" | "out", message: WireMessage) => void;
  /**
   * This backend instance's name `I` (1-64 characters of `[A-Za-z0-9._-]`, stable across
   * restarts, unique among instances): receive the replies of all sessions on one queue,
   * `<prefix>.instance.I` (protocol §4a). Without it (the default), one reply queue per session.
   */
  instance?: string;
  /**
   * The name `T` of the operator-configured tenant this client's RabbitMQ user belongs to (1-32
   * characters of `[a-z0-9_-]`, starting with a letter or digit): its reply queues are then
   * `<prefix>.session.T.<SessionId>` or `<prefix>.instance.T.<instance>`, the only ones the
   * tenant's user may declare and read. Without it (the default): no tenant, the names of §4 / §4a.
   * Every request carries `userId` = the URL's user either way (`client.userId`).
   */
  tenant?: string;
}

/** The broker did not take a request: returned as unroutable, or nacked. */
export class PublishError extends Error {
  override name = "PublishError";
}

/** The connection was lost and no broker node took a new one within `reconnectTimeoutMs`. */
export class ConnectionLost extends Error {
  override name = "ConnectionLost";
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
  /** The `reply_to` property it was published with (null: none, so the session's queue). */
  replyTo: string | null;
  /** How many times it was published before the broker confirmed it (1 unless resent). */
  attempts: number;
  /**
   * The AMQP `type` property it was published with: `turn.cancel` for a cancel (§7a), null for
   * a request (user turn or tool results).
   */
  type: string | null;
}

export interface SubmitOptions {
  messageId?: string;
  traceparent?: string;
  /** Check the body against the request schema first (default true, when schemas are loaded). */
  validate?: boolean;
  /**
   * The `reply_to` property to send instead of the session's own (`session.replyTo`: the
   * instance queue with an instance, none otherwise). The server refuses any value but the
   * session's queue or an instance queue with `request.reply_to_invalid`.
   */
  replyTo?: string;
  /**
   * The AMQP `type` property. `turn.cancel` (`CANCEL_TYPE`) publishes a cancel (§7a, see
   * `Session.cancelTurn`), whose body is not an AGN-034 request and is never checked against the
   * request schema. Without it (the default): no `type`, a request.
   */
  type?: string;
}

export type ToolHandler = (call: ToolCall) => ToolResult | Promise<ToolResult>;
/** Says whether a server tool call that needs approval may run: true, false, or a ToolDecision (a denial with a message). */
export type ApprovalHandler = (call: ToolCall) => boolean | ToolDecision | Promise<boolean | ToolDecision>;

/** The broker node URLs of `url`: one URL, a comma-separated string of them, or an array. */
export function parseUrls(url: string | readonly string[]): string[] {
  const items = typeof url === "string" ? [url] : [...url];
  const urls = items.flatMap((item) => item.split(",")).map((u) => u.trim()).filter((u) => u.length > 0);
  if (urls.length === 0) throw new Error("no broker URL given");
  return urls;
}

/** `url` with its password replaced by `***` (for logs and errors). */
export function redactUrl(url: string): string {
  return url.replace(/^([a-z+]+:\/\/[^:@/]*):[^@/]*@/i, "$1:***@");
}

/**
 * The RabbitMQ user an AMQP URL connects as: its username, percent-decoded
 * (`amqp://a%40b:pw@host/` -> `a@b`), or amqplib's default `guest` when the URL names neither a
 * user nor a password. Throws for a URL that cannot be parsed.
 */
export function urlUser(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
    if (parsed.username === "" && parsed.password === "") return DEFAULT_USER;
    return decodeURIComponent(parsed.username);
  } catch {
    throw new Error(`not an AMQP URL, or a badly percent-encoded user: ${redactUrl(url)}`);
  }
}

/**
 * The one RabbitMQ user of a cluster's node URLs (the `userId` of every request); throws when
 * they name different users.
 */
export function sharedUser(urls: readonly string[]): string {
  const users = [...new Set(urls.map(urlUser))].sort();
  if (users.length !== 1) {
    throw new Error(`the broker URLs name different users (${users.map((u) => JSON.stringify(u)).join(", ")}); the nodes of one client share one user`);
  }
  return users[0];
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * @internal Connects to the first node of `urls` that takes a connection, trying them all from a
 * random one; a node that refuses or does not answer within `timeoutMs` is skipped.
 */
export async function connectAny(
  urls: readonly string[],
  opts: { timeoutMs: number; connectionName: string },
  connect: (url: string, socketOptions: Record<string, unknown>) => Promise<Connection> = amqp.connect,
  random: () => number = Math.random,
): Promise<{ conn: Connection; node: number }> {
  const start = Math.floor(random() * urls.length) % urls.length;
  const errors: string[] = [];
  for (let i = 0; i < urls.length; i++) {
    const node = (start + i) % urls.length;
    const pending = connect(urls[node], { timeout: opts.timeoutMs, clientProperties: { connection_name: opts.connectionName } });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    });
    try {
      return { conn: await Promise.race([pending, timeout]), node };
    } catch (e) {
      pending.then((late) => late.close()).catch(() => undefined); // one that answers too late
      errors.push(`${redactUrl(urls[node])}: ${(e as Error).message}`);
    } finally {
      clearTimeout(timer);
    }
  }
  throw new Error(`no broker node took the connection: ${errors.join("; ")}`);
}

/** One connection to RabbitMQ for one Aptix deployment (its queue-name prefix). */
export class Client {
  private readonly sessions = new Set<Session>();
  private instanceQueue: Instance | null = null;
  /** The broker node URLs, in the order given. */
  readonly urls: string[];
  /** The RabbitMQ user of `urls`, sent as the `userId` property of every request. */
  readonly userId: string;
  /** The tenant whose reply queue names this client uses, or null. */
  readonly tenant: string | null;
  /** The index in `urls` of the node of the current connection. */
  node = 0;
  /** How many times the client reconnected after losing its connection. */
  reconnects = 0;
  /** @internal */
  readonly publishAttempts: number;
  private currentConn!: Connection;
  private connectedAt = Date.now();
  private delay: number;
  private closing = false;
  private recovering: Promise<void> | null = null;
  private lostError: Error | null = null;
  /** Holders whose queue the broker refused to declare during the current recovery. */
  private readonly toRestore: Reopens[] = [];

  private constructor(
    private readonly opts: ClientOptions,
    readonly prefix: string,
    readonly schemas: Schemas | null,
    readonly strict: boolean,
    readonly wireLog: ClientOptions["wireLog"],
  ) {
    this.urls = parseUrls(opts.url ?? DEFAULT_URL);
    this.userId = sharedUser(this.urls);
    this.tenant = opts.tenant ?? null;
    this.publishAttempts = opts.publishAttempts ?? DEFAULT_PUBLISH_ATTEMPTS;
    this.delay = (opts.reconnectBackoffMs ?? DEFAULT_RECONNECT_BACKOFF_MS)[0];
  }

  /** The current connection (a new one after each reconnect). */
  get conn(): Connection {
    return this.currentConn;
  }

  static async connect(opts: ClientOptions = {}): Promise<Client> {
    if (opts.instance !== undefined && !isInstanceName(opts.instance)) {
      throw new Error(`an instance name is 1-64 characters of [A-Za-z0-9._-], got ${JSON.stringify(opts.instance)}`);
    }
    if (opts.tenant !== undefined) checkTenantName(opts.tenant);
    if (opts.publishAttempts !== undefined && !(opts.publishAttempts >= 1)) throw new Error("publishAttempts must be at least 1");
    const schemas = loadSchemas(opts.schemas);
    const client = new Client(opts, opts.prefix ?? "aptix", schemas, opts.strict ?? true, opts.wireLog);
    await client.open();
    const conn = client.currentConn;
    if (opts.instance !== undefined) {
      try {
        client.instanceQueue = await Instance.start(client, opts.instance);
      } catch (e) {
        await conn.close().catch(() => undefined);
        throw e;
      }
    }
    return client;
  }

  private async open(): Promise<void> {
    const { conn, node } = await connectAny(this.urls, {
      timeoutMs: this.opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
      connectionName: this.opts.connectionName ?? `aptix-client ${this.prefix}`,
    });
    this.currentConn = conn;
    this.node = node;
    this.connectedAt = Date.now();
    conn.on("error", () => undefined); // "close" follows, with the error
    conn.on("close", (err?: Error) => {
      if (conn === this.currentConn) this.lost(err ?? new Error("the connection closed"));
    });
  }

  /** @internal the connection was lost: reconnect (or fail every session without `reconnect`). */
  private lost(cause: Error): void {
    if (this.closing || this.recovering) return;
    if (this.opts.reconnect === false) {
      this.giveUp(cause);
      return;
    }
    this.recovering = this.recover(cause).finally(() => {
      this.recovering = null;
      // Queues the broker refused to declare during the recovery are tried again now that
      // channel closes are their holders' business again.
      for (const holder of this.toRestore.splice(0)) holder.restoreSoon(null);
    });
    this.recovering.catch(() => undefined);
  }

  private giveUp(e: Error): void {
    this.lostError = e;
    for (const s of this.sessions) s.fail(e);
    this.instanceQueue?.fail(e);
  }

  private async recover(cause: Error): Promise<void> {
    const [first, longest] = this.opts.reconnectBackoffMs ?? DEFAULT_RECONNECT_BACKOFF_MS;
    const timeoutMs = this.opts.reconnectTimeoutMs ?? DEFAULT_RECONNECT_TIMEOUT_MS;
    if (Date.now() - this.connectedAt >= HEALTHY_AFTER_MS) this.delay = first;
    const giveUp = Date.now() + timeoutMs;
    let last: Error = cause;
    for (;;) {
      if (Date.now() >= giveUp) {
        const e = new ConnectionLost(`the connection was lost (${cause.message}) and no broker node took a new one within ${timeoutMs} ms; last error: ${last.message}`);
        this.giveUp(e);
        throw e;
      }
      await sleep(this.delay);
      this.delay = Math.min(this.delay * 2, longest);
      if (this.closing) return;
      try {
        this.toRestore.length = 0; // what an earlier attempt could not declare, this one tries again
        await this.open();
        if (this.instanceQueue) await reopenOrLater(this.instanceQueue, this.toRestore);
        else for (const s of this.sessions) await reopenOrLater(s, this.toRestore);
        this.reconnects++;
        return;
      } catch (e) {
        last = e as Error;
        this.currentConn?.close().catch(() => undefined);
      }
    }
  }

  /**
   * @internal Resolves once the client has a live connection again after a loss (at once when
   * it was not lost); rejects with `ConnectionLost` when it gave up.
   */
  async connected(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve)); // let a pending "close" arrive
    if (this.recovering) await this.recovering;
    if (this.lostError) throw this.lostError;
  }

  /** @internal true while the client is reconnecting or has given up: channel closes are then its business. */
  get reconnecting(): boolean {
    return this.recovering !== null || this.lostError !== null || this.closing;
  }

  /** The instance queue and its dispatcher (§4a) with `instance`; null per session. */
  get instance(): Instance | null {
    return this.instanceQueue;
  }

  /**
   * A session; a new SessionId when none is given. Per session (the default): declares and
   * consumes the session's reply queue. With an instance: declares nothing; the session's
   * messages are taken from the instance queue (those that arrived before it was opened
   * included); rejects if that session is already open on this instance.
   */
  async openSession(sessionId: string = randomUUID()): Promise<Session> {
    if (!isSessionId(sessionId)) throw new Error(`SessionId must be a UUID, got ${sessionId}`);
    // The server writes SessionIds in lower case (§1): a GUID spelt in upper case would declare a
    // queue no reply reaches.
    sessionId = sessionId.toLowerCase();
    if (this.instanceQueue) {
      const s = this.instanceQueue.open(sessionId);
      this.sessions.add(s);
      return s;
    }
    await this.connected();
    const s = new Session(this, sessionId, await this.conn.createConfirmChannel());
    try {
      await s.start();
    } catch (e) {
      s.fail(e as Error); // the application never gets this session: nothing of it goes on
      throw e;
    }
    this.sessions.add(s);
    return s;
  }

  /** @internal */
  forget(s: Session): void {
    this.sessions.delete(s);
  }

  /** Closes every session, the instance's channel (unacked messages go back to the queue), then the connection. */
  async close(): Promise<void> {
    this.closing = true;
    for (const s of [...this.sessions]) await s.close();
    if (this.instanceQueue) await this.instanceQueue.close();
    await this.conn.close().catch((e: Error) => {
      if (!this.lostError && !this.recovering) throw e;
    });
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

/** A message taken, with the channel that delivered it (its tag means nothing on another). */
type Item = { msg: ConsumeMessage; ch: ConfirmChannel; event?: AptixEvent; error?: Error };

/** An event's `x-aptix-event-seq`, when it has one. */
function eventSeq(e: AptixEvent): number | undefined {
  const n = e.headers?.[H_EVENT_SEQ];
  return typeof n === "number" ? n : undefined;
}

/** The turn a `resumed` notice names. */
function resumedNotice(content: Buffer): { turn: string; ended: boolean } | undefined {
  try {
    const body = JSON.parse(content.toString());
    return typeof body?.TurnId === "string" ? { turn: body.TurnId, ended: body.Ended === true } : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Acks a message on the channel that delivered it, when that channel is still the current one.
 * Otherwise (connection lost, channel replaced) the broker delivers it again and the copy is
 * dropped by message_id.
 */
/** A queue's holder: a session with a queue of its own, or an instance. */
interface Reopens {
  reopen(): Promise<void>;
  restoreSoon(ch: ConfirmChannel | null): void;
  fail(e?: Error): void;
}

/** The broker's reply code for a queue the user may not declare or read: not tried again. */
const ACCESS_REFUSED = 403;

/**
 * Declares and consumes a queue again after a reconnect. One the broker refuses to declare now
 * (404: its node is down; a channel error, not the connection's) is put in `later`, tried again
 * with back-off by its holder once the recovery is over, and the client's other queues go on.
 */
async function reopenOrLater(holder: Reopens, later: Reopens[]): Promise<void> {
  try {
    await holder.reopen();
  } catch (e) {
    if (!isChannelError(e)) throw e;
    later.push(holder);
  }
}

/** Whether an error closed a channel only (the broker's reply code to a channel method). */
function isChannelError(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "number" && [403, 404, 405, 406].includes(code);
}

/**
 * Declares and consumes a queue again, at once and then with back-off, until it works, its
 * holder fails or is closed (`gone`), or the client reconnects (which declares it again).
 */
async function restoreLoop(client: Client, holder: Reopens, gone: () => boolean): Promise<boolean> {
  let delay = RESTORE_BACKOFF_MS[0];
  for (;;) {
    if (gone() || client.reconnecting) return false;
    try {
      await holder.reopen();
      return true;
    } catch (e) {
      if ((e as { code?: unknown }).code === ACCESS_REFUSED) {
        holder.fail(e as Error); // waiting changes nothing: the application gets the cause
        return false;
      }
      await sleep(delay);
      delay = Math.min(delay * 2, RESTORE_BACKOFF_MS[1]);
    }
  }
}

function ackOn(ch: ConfirmChannel, current: ConfirmChannel, msg: ConsumeMessage): void {
  if (ch !== current) return;
  try {
    ch.ack(msg);
  } catch {
    // closed under us: it comes again
  }
}

/**
 * A backend instance's reply queue `<prefix>.instance.<name>` (protocol §4a), or
 * `<prefix>.instance.<tenant>.<name>` with a tenant, and the dispatcher that hands its messages to
 * the client's sessions. Made by `Client.connect({ instance })`: a confirm channel, the queue
 * declared once (durable, not exclusive, not auto-delete, no arguments) and consumed with manual
 * acks; the client's sessions publish on this channel with `replyTo` = the queue. Each message
 * goes to the open session named by its `x-aptix-session-id` header (else the body's
 * `SessionId`). Messages of a session that is not open are kept, unacked and in order, until it
 * is opened (`pendingSessions()` lists them); copies of messages already handled are acked and
 * dropped.
 */
export class Instance {
  readonly queue: string;
  /** Copies dropped while their session was not open (open sessions count their own). */
  duplicatesDropped = 0;
  /** Messages that name no session (acked: the server stores what it sends), as errors. */
  readonly unroutable: ProtocolError[] = [];
  /** @internal message_ids of requests the broker returned, shared by the sessions' publishes. */
  readonly returned = new Set<string>();
  private readonly sessions = new Map<string, Session>();
  private readonly waiting = new Map<string, ConsumeMessage[]>();
  private readonly seenIds = new Map<string, SeenIds>();
  private failure: Error | null = null;
  private reopening: Promise<void> | null = null;
  private restoring: Promise<boolean> | null = null;

  private constructor(
    readonly client: Client,
    readonly name: string,
    /** The current channel (a fresh one after a reconnect or a nack). */
    public channel: ConfirmChannel,
  ) {
    this.queue = instanceQueue(client.prefix, name, client.tenant ?? null); // stand-ins in tests may have no tenant
  }

  /** @internal the documented procedure, once per instance: declare, then consume. */
  static async start(client: Client, name: string): Promise<Instance> {
    const inst = new Instance(client, name, await client.conn.createConfirmChannel());
    await inst.setUp(inst.channel);
    return inst;
  }

  private async setUp(ch: ConfirmChannel): Promise<void> {
    ch.on("return", (m: { properties: MessageProperties }) => {
      if (m.properties.messageId) this.returned.add(String(m.properties.messageId));
    });
    // The broker closed the channel (an unknown ack, its consumer timeout) or cancelled the
    // consumer (the queue deleted, its node lost): declare and consume it again. A channel
    // replaced, or closed with a connection being taken again, is not this queue's trouble.
    const stopped = () => setImmediate(() => this.restoreSoon(ch));
    ch.on("error", () => undefined); // "close" follows
    ch.on("close", stopped);
    await ch.assertQueue(this.queue, { durable: true, exclusive: false, autoDelete: false, arguments: {} });
    await ch.consume(this.queue, (m) => (m ? this.dispatch(m, ch) : stopped()), { noAck: false });
  }

  /** @internal declares and consumes the queue again unless `ch` was replaced (null: whatever the channel). */
  restoreSoon(ch: ConfirmChannel | null): void {
    if (this.restoring || this.failure || (ch !== null && ch !== this.channel) || this.client.reconnecting) return;
    this.restoring = restoreLoop(this.client, this, () => this.failure !== null).finally(() => {
      this.restoring = null;
    });
  }

  /** @internal the channel failed for good: waiting calls of every session reject. */
  fail(e?: Error): void {
    this.failure ??= e ?? new Error(`channel of ${this.queue} closed`);
    for (const s of this.sessions.values()) s.fail(this.failure);
  }

  /**
   * @internal A fresh channel (after a reconnect, or instead of one that nacked): the queue
   * declared and consumed again. Messages not acked on the old one come again, so those kept for
   * sessions not open are forgotten; copies of handed-out ones are dropped by message_id.
   */
  reopen(): Promise<void> {
    // Two callers at once (nacks of two sessions' publishes) get one channel, one consumer.
    this.reopening ??= this.freshChannel().finally(() => {
      this.reopening = null;
    });
    return this.reopening;
  }

  private async freshChannel(): Promise<void> {
    const old = this.channel;
    this.channel = await this.client.conn.createConfirmChannel();
    old.close().catch(() => undefined);
    this.waiting.clear();
    await this.setUp(this.channel);
  }

  /** SessionIds with messages received for them while they were not open on this client. */
  pendingSessions(): string[] {
    return [...this.waiting].filter(([, msgs]) => msgs.length > 0).map(([sid]) => sid);
  }

  /**
   * The message_ids handled for a session on this instance (kept after the session closed, so
   * that late copies are dropped, for the newest `keepClosed` closed sessions).
   */
  seen(sessionId: string, keepClosed: number = SEEN_CLOSED_SESSIONS): SeenIds {
    let ids = this.seenIds.get(sessionId);
    if (!ids) {
      this.seenIds.set(sessionId, (ids = new SeenIds()));
      const closed = [...this.seenIds.keys()].filter((sid) => sid !== sessionId && !this.sessions.has(sid));
      for (const sid of closed.slice(0, Math.max(0, closed.length - keepClosed))) this.seenIds.delete(sid);
    }
    return ids;
  }

  private dispatch(msg: ConsumeMessage, ch: ConfirmChannel): void {
    const sid = messageSessionId(msg.properties.headers, msg.content);
    if (sid === null) {
      ackOn(ch, this.channel, msg);
      this.unroutable.push(new ProtocolError(`${msg.properties.messageId} on ${this.queue} names no session (no ${H_SESSION_ID})`));
      return;
    }
    const session = this.sessions.get(sid);
    if (session) {
      session.deliver(msg, ch);
      return;
    }
    const id = msg.properties.messageId ? String(msg.properties.messageId) : "";
    if (id && this.seenIds.get(sid)?.has(id)) {
      ackOn(ch, this.channel, msg);
      this.duplicatesDropped++;
      return;
    }
    const list = this.waiting.get(sid);
    if (list) list.push(msg);
    else this.waiting.set(sid, [msg]);
  }

  /** @internal */
  open(sessionId: string): Session {
    if (this.failure) throw this.failure;
    if (this.sessions.has(sessionId)) throw new Error(`session ${sessionId} is already open on instance ${this.name}`);
    const s = new Session(this.client, sessionId, this.channel, this);
    this.sessions.set(sessionId, s);
    const early = this.waiting.get(sessionId) ?? [];
    this.waiting.delete(sessionId);
    for (const m of early) s.deliver(m);
    return s;
  }

  /** @internal a session closed: what it had not handed out waits again for the next open. */
  detach(s: Session, unread: ConsumeMessage[]): void {
    if (this.sessions.get(s.sessionId) === s) this.sessions.delete(s.sessionId);
    const ids = this.seenIds.get(s.sessionId);
    if (ids) {
      // Closed now: the newest closed session, the last its ids are forgotten.
      this.seenIds.delete(s.sessionId);
      this.seenIds.set(s.sessionId, ids);
    }
    if (unread.length > 0) this.waiting.set(s.sessionId, [...unread, ...(this.waiting.get(s.sessionId) ?? [])]);
  }

  /** Deletes the instance queue (later replies for it go to `<prefix>.unrouted` (with tenants, `<prefix>.unrouted.<tenant>`) and stay in PostgreSQL). */
  async deleteQueue(): Promise<void> {
    await this.channel.deleteQueue(this.queue);
  }

  /** Closes the channel; unacked messages go back to the queue. */
  async close(): Promise<void> {
    if (this.failure) return;
    this.failure = new Error(`instance ${this.name} closed`);
    await this.channel.close().catch((e: Error) => {
      if (!this.client.reconnecting) throw e; // its connection is gone: nothing left to close
    });
  }
}

/**
 * One session: its requests and the typed events of its replies. Per session (§4) it owns a
 * confirm channel and its reply queue `<prefix>.session.<SessionId>`
 * (`<prefix>.session.<tenant>.<SessionId>` with a tenant); with an instance (§4a) it publishes on
 * the instance's channel with `replyTo` set, and its events come from the instance queue (`queue`
 * is then the instance queue).
 *
 * Events are deduplicated by message_id. A message is acked once the application has handled
 * it, that is when it asks for the next event (or closes the session); messages not yet handed
 * out go back to the queue if the channel closes.
 */
export class Session {
  /** The queue this session's messages arrive on. */
  readonly queue: string;
  /** The `reply_to` of this session's requests: the instance queue, or null (no property) per session. */
  readonly replyTo: string | null;
  readonly seen: SeenIds;
  duplicatesDropped = 0;
  private inbox: Item[] = [];
  private handled: Item[] = [];
  private readonly returned: Set<string>;
  private wake: (() => void)[] = [];
  private failure: Error | null = null;
  /** The calls each turn waits for (from its latest tool_calls), to order results by. */
  readonly pendingCalls = new Map<string, string[]>();
  /** Streamed turns not yet over: the last x-aptix-event-seq handed out (-1: none yet). */
  private readonly streaming = new Map<string, number>();
  /** The messageId of the request that started each tracked turn: its refusal ends the tracking. */
  private readonly startedBy = new Map<string, string>();
  /** Turns being resumed (§9a): the cursor sent, and their events held until the notice. */
  private readonly resuming = new Map<string, { after: number; held: Item[]; messageId: string }>();
  /** How many times this session resumed a turn's stream by itself after a reconnect. */
  resumes = 0;
  /**
   * How many times it declared and consumed its queue again while connected (§4 step 2), its
   * channel closed or its consumer cancelled by the broker.
   */
  restores = 0;
  /**
   * message_ids of the resumes this session sent by itself, the newest 256: their refusals are
   * its own (kept when a publish failed: an earlier attempt may have gone).
   */
  private readonly autoResumes = new SeenIds(256);
  private reopening: Promise<void> | null = null;
  private restoring: Promise<boolean> | null = null;

  constructor(
    readonly client: Client,
    readonly sessionId: string,
    private ownCh: ConfirmChannel,
    /** The instance whose queue this session reads (§4a), or undefined for its own queue. */
    readonly instance?: Instance,
  ) {
    if (instance) {
      this.queue = instance.queue;
      this.replyTo = instance.queue;
      this.seen = instance.seen(sessionId);
      this.returned = instance.returned;
    } else {
      this.queue = sessionQueue(client.prefix, sessionId, client.tenant ?? null);
      this.replyTo = null;
      this.seen = new SeenIds();
      this.returned = new Set();
    }
  }

  /** The channel this session publishes, consumes and acks on (the instance's, with one). */
  private get ch(): ConfirmChannel {
    return this.instance ? this.instance.channel : this.ownCh;
  }

  /** @internal the documented procedure: declare (durable, no arguments), then consume. */
  async start(): Promise<void> {
    const ch = this.ownCh;
    ch.on("return", (m: { properties: MessageProperties }) => {
      if (m.properties.messageId) this.returned.add(String(m.properties.messageId));
    });
    // The broker closed the channel (an unknown ack, its consumer timeout) or cancelled the
    // consumer (the queue deleted, its node lost): declare and consume it again. A channel
    // replaced, or closed with a connection being taken again, is not this queue's trouble.
    const stopped = () => setImmediate(() => this.restoreSoon(ch));
    ch.on("error", () => undefined); // "close" follows
    ch.on("close", stopped);
    await ch.assertQueue(this.queue, { durable: true, arguments: {} });
    await ch.consume(this.queue, (m) => (m ? this.deliver(m, ch) : stopped()), { noAck: false });
  }

  /** @internal declares and consumes the queue again unless `ch` was replaced (null: whatever the channel). */
  restoreSoon(ch: ConfirmChannel | null): void {
    if (this.instance) {
      this.instance.restoreSoon(ch);
      return;
    }
    if (this.restoring || this.failure || (ch !== null && ch !== this.ownCh) || this.client.reconnecting) return;
    this.restoring = restoreLoop(this.client, this, () => this.failure !== null)
      .then((done) => {
        if (done) this.restores++;
        return done;
      })
      .finally(() => {
        this.restoring = null;
      });
  }

  /**
   * @internal A fresh channel (after a reconnect, or instead of one that nacked): the queue
   * declared and consumed again. Messages not acked on the old one come again; copies of those
   * already taken are dropped by message_id, errors not yet read are dropped (they come again).
   */
  reopen(): Promise<void> {
    if (this.instance) return this.instance.reopen();
    // Two callers at once (two nacked publishes) get one channel, one consumer.
    this.reopening ??= this.freshChannel().finally(() => {
      this.reopening = null;
    });
    return this.reopening;
  }

  private async freshChannel(): Promise<void> {
    if (this.failure) return;
    const old = this.ownCh;
    const ch = await this.client.conn.createConfirmChannel();
    if (this.failure) {
      // Closed while the channel was being opened: it consumes nothing.
      ch.close().catch(() => undefined);
      return;
    }
    this.ownCh = ch;
    old.close().catch(() => undefined);
    this.inbox = this.inbox.filter((it) => !(it.error && it.ch === old));
    try {
      await this.start();
    } catch (e) {
      if (this.failure) return; // closed meanwhile: nothing to declare any more
      throw e;
    }
    // What was published while the queue was gone (its node down, deleted) is not in it:
    // streamed turns still running are resumed from the last event handed out. Not awaited:
    // a resume's publish that fails waits for the client's recovery, which may be this call.
    for (const [turnId, last] of this.streaming) {
      if (this.resuming.has(turnId)) continue;
      this.resumes++;
      this.startResume(turnId, last >= 0 ? last : undefined, true).catch(() => undefined);
    }
  }

  /** @internal the channel failed or closed: waiting calls reject. */
  fail(e?: Error): void {
    this.failure ??= e ?? new Error(`channel of ${this.queue} closed`);
    this.notify();
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
    // Tracked before the publish: its first events may arrive while the confirm is awaited.
    const messageId = opts.messageId ?? randomUUID();
    const track = opts.stream === true && !this.instance && !this.streaming.has(turnId);
    if (track) {
      this.streaming.set(turnId, -1);
      this.startedBy.set(turnId, messageId);
    }
    Object.assign(body, opts.fields ?? {});
    return this.submit(body, { ...opts, messageId }).catch((e: unknown) => {
      if (track) this.untrack(turnId);
      throw e;
    });
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

  /**
   * Publishes a Tool Approval Submission (protocol v3): a decision for each call of the turn's
   * approval_required reply. When this session received that reply, `decisions` must name exactly
   * its calls (an Error otherwise) and are sent in the order of the calls. Sent again with the same
   * messageId it changes nothing more: an approved call runs once.
   */
  async submitApprovals(turnId: string, decisions: ToolDecision[], opts: SubmitOptions = {}): Promise<Submission> {
    const ordered = this.inCallOrder(turnId, decisions, "decisions on");
    const body = { SessionId: this.sessionId, TurnId: turnId, ToolApprovals: ordered.map(ToolDecision.toWire) };
    return this.submit(body, opts);
  }

  private inCallOrder<T extends { toolCallId: string }>(turnId: string, answers: T[], what = "results of"): T[] {
    const expected = this.pendingCalls.get(turnId);
    if (!expected) return answers;
    const byId = new Map(answers.map((r) => [r.toolCallId, r]));
    const same = byId.size === answers.length && answers.length === expected.length && expected.every((id) => byId.has(id));
    if (!same) {
      throw new Error(`turn ${turnId} waits for ${what} ${expected.join(", ")}, got ${answers.map((r) => r.toolCallId).join(", ")}`);
    }
    return expected.map((id) => byId.get(id) as T);
  }

  /**
   * Publishes any request body (an object, or a Buffer sent as it is) and waits for the broker's
   * confirm. To re-send the same submission, pass its messageId (and type) again. Every request
   * carries `userId` = the client's `userId` (the URL's user).
   */
  async submit(body: Json | Buffer, opts: SubmitOptions = {}): Promise<Submission> {
    const raw = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const parsed: unknown = Buffer.isBuffer(body) ? maybeJson(body) : body;
    const type = opts.type ?? null;
    if ((opts.validate ?? true) && type !== CANCEL_TYPE && this.client.schemas && !Buffer.isBuffer(body)) {
      this.client.schemas.checkRequest(body);
    }
    const messageId = opts.messageId ?? randomUUID();
    const headers = opts.traceparent ? { [H_TRACEPARENT]: opts.traceparent } : undefined;
    const exchange = requestsExchange(this.client.prefix);
    const replyTo = opts.replyTo ?? this.replyTo;
    const userId: string | undefined = this.client.userId; // stand-ins in tests may have none
    const props = {
      contentType: CONTENT_TYPE, deliveryMode: 2, messageId, headers, mandatory: true, userId, ...(replyTo === null ? {} : { replyTo }),
      ...(type === null ? {} : { type }),
    };
    const attempts = await this.publish(exchange, raw, props, messageId);
    this.client.wireLog?.("out", {
      exchange,
      routingKey: this.sessionId,
      mandatory: true,
      properties: { ...(type === null ? {} : { type }), message_id: messageId, ...(replyTo === null ? {} : { reply_to: replyTo }), ...(userId === undefined ? {} : { user_id: userId }), content_type: CONTENT_TYPE, delivery_mode: 2 },
      headers: headers ?? {},
      body: parsed,
    });
    const turn = (parsed as Json | null)?.TurnId;
    return { messageId, sessionId: this.sessionId, turnId: typeof turn === "string" ? turn : null, body: parsed, replyTo, attempts, type };
  }

  /**
   * Publishes a cancel of turn `turnId` (protocol §7a) and waits for the broker's confirm:
   * `{"SessionId", "TurnId"}` with the AMQP `type` = `turn.cancel`, like any request (persistent,
   * JSON, mandatory, `userId`, `replyTo` with an instance).
   *
   * A turn that is queued, running or waiting for tool results then ends with its own step reply,
   * a `failed` with code `turn.cancelled` (read it with `turnEvents(turnId)` or `nextEvent`); no
   * delta of it follows. A turn that already ended gets a `refused` with code `turn.finished`, an
   * unknown one `turn.not_found` (id tag `rejected-cancel`, `correlationId` = this cancel's
   * messageId); a repeated cancel gets nothing. Tool results sent for a cancelled turn are refused
   * with `tool_results.turn_cancelled`.
   */
  cancelTurn(turnId: string, opts: { messageId?: string; traceparent?: string } = {}): Promise<Submission> {
    const body: Json = { SessionId: this.sessionId, TurnId: turnId };
    return this.submit(body, { messageId: opts.messageId, traceparent: opts.traceparent, validate: false, type: CANCEL_TYPE });
  }

  /**
   * Publishes a resume of turn `turnId`'s stream (protocol §9a) after event `after` (an
   * `x-aptix-event-seq`; everything when undefined). The turn's events are then held until the
   * server's `resumed` notice and handed out in event order, each once. The client does this by
   * itself after a reconnect for every streamed turn not yet over.
   */
  resumeTurn(turnId: string, after?: number): Promise<Submission> {
    return this.startResume(turnId, after, false);
  }

  /**
   * A resume; `auto` for one the client sends by itself, whose refusal is not the application's
   * (a turn not admitted yet while its request is sent again, a session resumed too often).
   */
  private startResume(turnId: string, after: number | undefined, auto: boolean): Promise<Submission> {
    const body: Json = { SessionId: this.sessionId, TurnId: turnId };
    if (after !== undefined) body.AfterSeq = after;
    // The notice (or a refusal) names this message_id as its correlation_id.
    const messageId = randomUUID();
    this.resuming.set(turnId, { after: after ?? -1, held: [], messageId });
    if (auto) this.autoResumes.add(messageId);
    return this.submit(body, { messageId, validate: false, type: RESUME_TYPE }).catch((e: unknown) => {
      this.release(turnId);
      throw e;
    });
  }

  /**
   * Publishes until the broker confirms (§4 step 4): a return or a nack is sent again (a nacking
   * or closed channel is replaced by a fresh one), a confirm lost with the connection is sent
   * again after reconnecting. Resolves to the attempts; PublishError after the last.
   */
  private async publish(exchange: string, raw: Buffer, props: amqp.Options.Publish, messageId: string): Promise<number> {
    const limit = this.client.publishAttempts ?? DEFAULT_PUBLISH_ATTEMPTS;
    let delay = PUBLISH_BACKOFF_MS[0];
    for (let attempt = 1; ; attempt++) {
      const used = this.ch;
      const outcome = await new Promise<"ok" | "returned" | "nacked" | "closed">((resolve) => {
        try {
          this.ch.publish(exchange, this.sessionId, raw, props, (err) => {
            // RabbitMQ sends basic.return before the ack of the same message; match by message_id.
            if (err) resolve(/nack/i.test(String((err as Error).message ?? err)) ? "nacked" : "closed");
            else if (this.returned.delete(messageId)) resolve("returned");
            else resolve("ok");
          });
        } catch {
          resolve("closed"); // the channel was already closed
        }
      });
      if (outcome === "ok") return attempt;
      const why =
        outcome === "returned" ? `${exchange} returned request ${messageId} as unroutable`
        : outcome === "nacked" ? `the broker nacked request ${messageId}`
        : `the channel or connection closed before request ${messageId} was confirmed`;
      if (attempt >= limit) throw new PublishError(`${why} (gave up after ${attempt} attempts)`);
      if (this.failure && outcome === "closed") throw this.failure;
      await sleep(delay);
      delay = Math.min(delay * 2, PUBLISH_BACKOFF_MS[1]);
      await this.client.connected(); // after a loss: reconnected, channels taken again
      // A reconnect already gave this session a fresh channel; a second one would make every
      // unacked reply come again once more.
      if (outcome !== "returned" && this.ch === used) {
        try {
          await this.reopen();
        } catch {
          await this.client.connected(); // lost again meanwhile: the next attempt tells
        }
      }
      if (this.failure) throw this.failure;
    }
  }

  /** @internal takes one message of this session: drops a copy, parses and checks it, queues it. */
  deliver(msg: ConsumeMessage, ch: ConfirmChannel = this.ch): void {
    const p = msg.properties;
    const id = p.messageId ? String(p.messageId) : "";
    if (p.type === KIND_RESUMED) {
      ackOn(ch, this.ch, msg);
      const notice = resumedNotice(msg.content);
      if (p.correlationId) this.autoResumes.delete(String(p.correlationId));
      // Another resume's notice (an attach, another process's) ends nothing of this one.
      if (notice !== undefined && this.resuming.get(notice.turn)?.messageId === p.correlationId) {
        this.release(notice.turn);
        // Its end was among what came again (or handed out before): nothing live follows.
        if (notice.ended) this.untrack(notice.turn);
      }
      this.notify();
      return;
    }
    if (id && this.seen.has(id)) {
      this.duplicatesDropped++;
      ackOn(ch, this.ch, msg);
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
      if ((event.type === "tool_calls" || event.type === "approval_required") && event.turnId) {
        this.pendingCalls.set(event.turnId, event.calls.map((c) => c.toolCallId));
      }
      else if ((event.type === "final" || event.type === "failed") && event.turnId) this.pendingCalls.delete(event.turnId);
      this.client.wireLog?.("in", { queue: this.queue, properties: wireProps(p), headers: { ...(p.headers ?? {}) }, body: event.body });
      const resuming = event.turnId ? this.resuming.get(event.turnId) : undefined;
      const answers = event.correlationId ?? null;
      if (resuming && answers === resuming.messageId) {
        // The resume itself was refused (an unknown turn): no notice comes.
        this.release(event.turnId ?? undefined);
      }
      if (event.type === "refused" && answers !== null && this.autoResumes.delete(answers)) {
        // A resume the client sent by itself was refused: nothing of the application's ended,
        // and the turn stays tracked (its events still come live).
        ackOn(ch, this.ch, msg);
        this.notify();
        return;
      }
      if (resuming && answers !== resuming.messageId) {
        resuming.held.push({ msg, ch, event });
        return;
      }
      this.handOut({ msg, ch, event });
    } catch (e) {
      this.inbox.push({ msg, ch, error: e as Error });
    }
    this.notify();
  }

  /** Queues an event for the application, noting how far its turn's stream got. */
  private handOut(item: Item): void {
    const e = item.event;
    const turn = e?.turnId;
    if (e && turn && this.streaming.has(turn)) {
      const n = eventSeq(e);
      if (n !== undefined) this.streaming.set(turn, Math.max(this.streaming.get(turn)!, n));
      // A refusal is final for its submission only (§6): the turn ends with final or failed, or
      // never starts when the request that started it is refused (nothing was stored).
      // ... except when the refusal says the turn exists: a copy of the request answered as an
      // attach past the resume limit, or a TurnId another body already started.
      const startedBy = this.startedBy.get(turn);
      const refusedStart =
        e.type === "refused" && startedBy !== undefined && e.correlationId === startedBy && e.code !== CODE_TURN_CONFLICT && e.code !== CODE_RESUMES_LIMIT;
      if (e.type === "final" || e.type === "failed" || refusedStart) this.untrack(turn);
    }
    this.inbox.push(item);
  }

  private untrack(turn: string): void {
    this.streaming.delete(turn);
    this.startedBy.delete(turn);
  }

  /** Hands out a resumed turn's held events: in event order, after the cursor, each once. */
  private release(turn: string | undefined): void {
    if (turn === undefined) return;
    const r = this.resuming.get(turn);
    if (!r) return;
    this.resuming.delete(turn);
    r.held.sort((a, b) => (eventSeq(a.event!) ?? 0) - (eventSeq(b.event!) ?? 0));
    for (const it of r.held) {
      const n = eventSeq(it.event!);
      if (n !== undefined && n <= r.after) ackOn(it.ch, this.ch, it.msg);
      else this.handOut(it);
    }
  }

  private notify(): void {
    const w = this.wake;
    this.wake = [];
    for (const f of w) f();
  }

  private ackHandled(): void {
    if (this.failure) return;
    for (const it of this.handled) ackOn(it.ch, this.ch, it.msg);
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
        this.handled.push(it);
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
   * (in order), submits the results, asks `approve` about every server tool call that needs
   * approval, submits the decisions, and returns the final reply (Final, Failed or Refused).
   */
  async runTurn(
    turnId: string,
    instruction: string | undefined,
    opts: {
      tools?: ToolHandler;
      approve?: ApprovalHandler;
      onEvent?: (e: AptixEvent) => void;
      timeoutMs?: number;
      stream?: boolean;
      fields?: Json;
    } = {},
  ): Promise<Final | Failed | Refused> {
    await this.submitTurn(turnId, instruction, { stream: opts.stream, fields: opts.fields });
    let decided: string | null = null; // the messageId of the decisions last sent
    for (;;) {
      let next: Reply | null = null;
      for await (const e of this.turnEvents(turnId, opts)) {
        opts.onEvent?.(e);
        if (e.type !== "delta") next = e;
      }
      if (next === null) throw new Error(`turn ${turnId} ended without a reply`);
      if (next.type === "refused" && decided !== null && next.correlationId === decided && LATE_DECISION_CODES.includes(next.code)) {
        // Decided too late (the request expired, its calls denied): the turn goes on.
        decided = null;
        continue;
      }
      if (next.type === "approval_required") {
        if (!opts.approve) throw new Error(`turn ${turnId} asks for approvals and no handler was given`);
        const decisions: ToolDecision[] = [];
        for (const c of next.calls) {
          const answer = await opts.approve(c);
          decisions.push(typeof answer === "boolean" ? (answer ? ToolDecision.approve(c) : ToolDecision.deny(c)) : answer);
        }
        decided = (await this.submitApprovals(turnId, decisions)).messageId;
        continue;
      }
      if (next.type !== "tool_calls") return next;
      if (!opts.tools) throw new Error(`turn ${turnId} asks for tools and no handler was given`);
      const results: ToolResult[] = [];
      for (const c of next.calls) results.push(await opts.tools(c));
      await this.submitToolResults(turnId, results);
    }
  }

  /**
   * Acks handled messages and closes the channel; unread messages stay on the queue. With an
   * instance, the shared channel stays open: unread messages stay unacked and go to this session
   * again when it is reopened on the same client.
   */
  async close(): Promise<void> {
    this.client.forget(this);
    if (this.instance) {
      this.ackHandled();
      for (const it of this.inbox) if (it.event?.messageId) this.seen.delete(it.event.messageId); // not handled
      this.instance.detach(this, this.inbox.splice(0).filter((it) => it.ch === this.ch).map((it) => it.msg));
      this.fail(new Error("session closed"));
      return;
    }
    if (this.failure) return;
    this.ackHandled();
    this.failure = new Error("session closed");
    await this.ch.close().catch((e: Error) => {
      if (!this.client.reconnecting) throw e; // its connection is gone: nothing left to close
    });
  }

  /**
   * Deletes the reply queue. The broker then cancels this session's consumer, and the session
   * declares and consumes the queue again (the server declares it too, at the session's next
   * admitted turn); what it held is gone, and replies the server could not deliver meanwhile wait
   * in PostgreSQL for it (§12). Not for a session of an instance, which has no queue of its own:
   * see `Instance.deleteQueue`.
   */
  async deleteQueue(): Promise<void> {
    if (this.instance) throw new Error(`session ${this.sessionId} reads the instance queue ${this.queue}; it has no queue of its own to delete`);
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
    ["replyTo", "reply_to"],
    ["userId", "user_id"],
    ["contentType", "content_type"],
    ["deliveryMode", "delivery_mode"],
  ];
  for (const [k, n] of names) if (p[k] !== undefined) out[n] = p[k];
  return out;
}
