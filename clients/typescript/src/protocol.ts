/**
 * Names, header keys and the message_id grammar of the Aptix client protocol (v2). Pure: no
 * broker, no I/O; the rest of the package builds on it.
 */

export const CONTENT_TYPE = "application/json";

export const H_SESSION_ID = "x-aptix-session-id";
export const H_TURN_ID = "x-aptix-turn-id";
export const H_KIND = "x-aptix-kind";
export const H_FINAL = "x-aptix-final";
export const H_STEP = "x-aptix-step";
export const H_SEQ = "x-aptix-seq";
/** An event's place in its turn, across steps (deltas and step replies; §9a). */
export const H_EVENT_SEQ = "x-aptix-event-seq";
export const H_OUTCOME = "x-aptix-outcome";
export const H_PROTOCOL = "x-aptix-protocol";
/** The version of docs/client-protocol.md this client is written for (§1a); servers since version 2 send theirs in H_PROTOCOL. */
export const PROTOCOL_VERSION = 3;
export const H_TRACEPARENT = "traceparent";

export type Outcome = "final" | "client_tool_continuation" | "tool_approval_required" | "failed" | "refused";
export const OUTCOMES: readonly Outcome[] = ["final", "client_tool_continuation", "tool_approval_required", "failed", "refused"];
/** Outcomes after which the turn waits for the client (`x-aptix-final` = false); the second is protocol v3. */
export const WAITING_OUTCOMES: readonly Outcome[] = ["client_tool_continuation", "tool_approval_required"];
/** Refusals of decisions that came too late (§8a): the turn goes on without them. */
export const LATE_DECISION_CODES: readonly string[] = ["tool_approvals.expired", "turn.not_awaiting_approval"];

export const SUBMISSION_TAGS = [
  "rejected",
  "rejected-context",
  "rejected-awaiting",
  "rejected-continuation",
  "conflict",
  "resent",
  "exhausted",
  "unavailable",
  "limited",
  "rejected-cancel",
  "rejected-busy",
  "rejected-follow-up",
  "rejected-resume",
] as const;
export type SubmissionTag = (typeof SUBMISSION_TAGS)[number];

/** The TurnId of a reply to a request that named no valid one. */
export const NO_TURN = "-";

/**
 * The AMQP `type` property of a cancel (§7a): body exactly `{"SessionId", "TurnId"}`, published
 * like a request. Server messages carry `reply`, `delta` or `dead` there instead.
 */
export const CANCEL_TYPE = "turn.cancel";
/** The AMQP `type` of a resume of a turn's stream (§9a). */
export const RESUME_TYPE = "turn.resume";

/** A cancelled turn's own step reply (outcome `failed`, final): the turn was cancelled (§7a). */
export const CODE_TURN_CANCELLED = "turn.cancelled";
/**
 * A warning (`warnings`) on the reply of a follow-up that steered another turn (`FollowUp:
 * "steer"`, §11): the reply is that turn's ending, told about this one.
 */
export const CODE_TURN_STEERED = "turn.steered";
/** A cancel refused (`rejected-cancel-…`) because its turn had already ended (§7a). */
export const CODE_TURN_FINISHED = "turn.finished";
/**
 * A cancel (`rejected-cancel-…`) or a continuation (`rejected-continuation-…`) refused because
 * its turn does not exist in the session.
 */
export const CODE_TURN_NOT_FOUND = "turn.not_found";
/** Tool results refused (`rejected-continuation-…`) because their turn was cancelled (§7a). */
export const CODE_TOOL_RESULTS_TURN_CANCELLED = "tool_results.turn_cancelled";

/**
 * The error code of a request whose `reply_to` names neither the session's queue nor an instance
 * queue (§4a, §10).
 */
export const CODE_REPLY_TO_INVALID = "request.reply_to_invalid";

/** Tenant mode: the SessionId belongs to another tenant (a user turn, a duplicate or tool results). */
export const CODE_SESSION_UNAVAILABLE = "session.unavailable";
/**
 * Tenant mode: a later turn names another AgentContextId or ConversationContextId than the
 * session was created with.
 */
export const CODE_CONTEXT_FIXED = "session.context_fixed";
/** The session is busy and the turn rejects follow-ups (its `FollowUp` or its mode's policy, §11). */
/**
 * The `type` of the notice that ends what a `turn.resume`, or a running turn's request published
 * again, sends again (§9a).
 */
export const KIND_RESUMED = "resumed";

export const CODE_SESSION_BUSY = "session.busy";
/** A request reusing a TurnId with another body (§11): the turn exists, started by that body. */
export const CODE_TURN_CONFLICT = "turn.conflict";
/**
 * A resume, or a copy of a running turn's request answered as one, past the session's
 * `pipeline.resumes_per_minute` (§9a, tag `rejected-resume`).
 */
export const CODE_RESUMES_LIMIT = "limit.resumes_per_minute";
/**
 * 256 turns already wait behind the session's active turn (§11, tag `rejected-busy`): nothing was
 * stored; send it again later under a new messageId.
 */
export const CODE_SESSION_QUEUE_FULL = "session.queue_full";
/** The turn's `FollowUp` is one its ConversationContext does not let a request choose (§11). */
export const CODE_FOLLOW_UP_NOT_ALLOWED = "context.follow_up_not_allowed";
/**
 * Tenant mode: the tenant is over one of its limits and its configuration says refuse;
 * `limit.budget_exhausted` also fails a turn whose next call could pass a money budget.
 */
export const LIMIT_CODES = [
  "limit.turns_in_flight",
  "limit.turns_per_minute",
  "limit.sessions_per_minute",
  "limit.tokens_per_minute",
  "limit.budget_exhausted",
] as const;

const TURN_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const SUBMISSION = new RegExp(`^(${SUBMISSION_TAGS.join("|")})-([0-9a-fA-F]{24})$`);
const STEP_TAG = /^step-([0-9]+)$/;
const INSTANCE = /^[A-Za-z0-9._-]{1,64}$/;
const TENANT = /^[a-z0-9][a-z0-9_-]{0,31}$/;

/** The entry exchange every request is published to (routing key = SessionId). */
export function requestsExchange(prefix: string): string {
  return `${prefix}.requests`;
}

/**
 * A session's reply queue, declared durable with no arguments by client and server:
 * `<prefix>.session.<SessionId>`, or `<prefix>.session.<tenant>.<SessionId>` for a tenant's
 * session. Throws for a tenant that is not a tenant name.
 */
export function sessionQueue(prefix: string, sessionId: string, tenant?: string | null): string {
  return `${prefix}.session.${tenantSegment(tenant)}${sessionId}`;
}

/**
 * A backend instance's reply queue (§4a), declared durable with no arguments by the client;
 * requests published with `replyTo` = this name get their replies there:
 * `<prefix>.instance.<instance>`, or `<prefix>.instance.<tenant>.<instance>` for a tenant's
 * instance. Throws for a tenant that is not a tenant name.
 */
export function instanceQueue(prefix: string, instance: string, tenant?: string | null): string {
  return `${prefix}.instance.${tenantSegment(tenant)}${instance}`;
}

/** Whether `v` is a valid instance name `I`: 1-64 characters of `[A-Za-z0-9._-]`. */
export function isInstanceName(v: string): boolean {
  return INSTANCE.test(v);
}

/**
 * Whether `v` is a valid tenant name `T`: 1-32 characters of `[a-z0-9_-]`, the first a lowercase
 * letter or a digit (`^[a-z0-9][a-z0-9_-]{0,31}$`).
 */
export function isTenantName(v: string): boolean {
  return typeof v === "string" && TENANT.test(v);
}

/** `v` when it is a valid tenant name; throws an Error saying what one is otherwise. */
export function checkTenantName(v: string): string {
  if (!isTenantName(v)) {
    throw new Error(`a tenant name is 1-32 characters of [a-z0-9_-] starting with a lowercase letter or a digit, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** The `<tenant>.` a tenant's reply queue names carry after the mode; empty without one. */
function tenantSegment(tenant: string | null | undefined): string {
  return tenant === undefined || tenant === null ? "" : `${checkTenantName(tenant)}.`;
}

/**
 * The session a server message belongs to, as an instance queue tells them apart (§4a): the
 * `x-aptix-session-id` header, else the body's `SessionId` (a delta's or a reply's own, or a
 * reply's `Result.SessionId`); null when the message names none.
 */
export function messageSessionId(headers: Record<string, unknown> | undefined, body: Buffer | string): string | null {
  const h = headers?.[H_SESSION_ID];
  if (typeof h === "string" && h !== "") return h;
  let data: unknown;
  try {
    data = JSON.parse(body.toString());
  } catch {
    return null;
  }
  const holders = [data, (data as { Result?: unknown } | null)?.Result];
  for (const holder of holders) {
    if (holder !== null && typeof holder === "object" && !Array.isArray(holder)) {
      const sid = (holder as { SessionId?: unknown }).SessionId;
      if (typeof sid === "string" && sid !== "") return sid;
    }
  }
  return null;
}

export function isTurnId(v: string): boolean {
  return TURN_ID.test(v);
}

export function isSessionId(v: string): boolean {
  return UUID.test(v);
}

/** A parsed reply id: `reply:<SessionId>:<turn>:<reply-tag>`. */
export interface ReplyId {
  kind: "reply";
  sessionId: string;
  /** null for "-" */
  turnId: string | null;
  /** for `step-N` */
  step: number | null;
  /** for `<tag>-<24 hex>` */
  submissionTag: SubmissionTag | null;
  fingerprint: string | null;
}

/** A parsed delta id: `delta:<SessionId>:<TurnId>:<step>:<seq>`. */
export interface DeltaId {
  kind: "delta";
  sessionId: string;
  turnId: string;
  step: number;
  seq: number;
}

/** A message on a reply queue breaks protocol v3 (missing or mistyped header, bad id, ...). */
export class ProtocolError extends Error {
  override name = "ProtocolError";
}

function splitFirst(s: string): [string, string] | null {
  const i = s.indexOf(":");
  return i < 0 ? null : [s.slice(0, i), s.slice(i + 1)];
}

function splitLast(s: string): [string, string] | null {
  const i = s.lastIndexOf(":");
  return i < 0 ? null : [s.slice(0, i), s.slice(i + 1)];
}

/**
 * Parses a reply or delta message_id; throws ProtocolError when it breaks the grammar. TurnIds
 * may contain `:`, so the id is split from both ends.
 */
export function parseMessageId(id: string): ReplyId | DeltaId {
  const bad = (why: string): never => {
    throw new ProtocolError(`${why}: ${JSON.stringify(id)}`);
  };
  if (id.startsWith("reply:")) {
    const a = splitFirst(id.slice(6)) ?? bad("malformed reply id");
    const b = splitLast(a[1]) ?? bad("malformed reply id");
    const [session, [turn, tag]] = [a[0], b];
    if (!isSessionId(session)) bad("bad session in reply id");
    if (turn !== NO_TURN && !isTurnId(turn)) bad("bad turn in reply id");
    const turnId = turn === NO_TURN ? null : turn;
    const step = STEP_TAG.exec(tag);
    if (step) {
      if (turnId === null) bad("a step reply needs a turn");
      return { kind: "reply", sessionId: session, turnId, step: Number(step[1]), submissionTag: null, fingerprint: null };
    }
    const sub = SUBMISSION.exec(tag) ?? bad("unknown reply tag");
    return {
      kind: "reply",
      sessionId: session,
      turnId,
      step: null,
      submissionTag: sub[1] as SubmissionTag,
      fingerprint: sub[2].toLowerCase(),
    };
  }
  if (id.startsWith("delta:")) {
    const a = splitFirst(id.slice(6)) ?? bad("malformed delta id");
    const b = splitLast(a[1]) ?? bad("malformed delta id");
    const c = splitLast(b[0]) ?? bad("malformed delta id");
    const [session, turn, step, seq] = [a[0], c[0], c[1], b[1]];
    if (!isSessionId(session) || !isTurnId(turn)) bad("malformed delta id");
    if (!/^[0-9]+$/.test(step) || !/^[0-9]+$/.test(seq)) bad("bad step or seq in delta id");
    return { kind: "delta", sessionId: session, turnId: turn, step: Number(step), seq: Number(seq) };
  }
  return bad("unknown message id");
}

export type Headers = Record<string, unknown>;

const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);

/** Checks the headers a reply or delta must carry, with their AMQP types; names every problem. */
export function checkReplyHeaders(kind: string | undefined, messageId: string | undefined, h: Headers): void {
  const problems: string[] = [];
  if (kind !== "reply" && kind !== "delta") problems.push(`property type is ${JSON.stringify(kind)}, not reply or delta`);
  if (!messageId) problems.push("no message_id");
  for (const name of [H_SESSION_ID, H_TURN_ID, H_KIND]) {
    if (typeof h[name] !== "string") problems.push(`${name} is ${JSON.stringify(h[name])}, not a string`);
  }
  if (h[H_KIND] !== kind) problems.push(`${H_KIND} ${JSON.stringify(h[H_KIND])} differs from type ${JSON.stringify(kind)}`);
  if (kind === "reply") {
    if (typeof h[H_FINAL] !== "boolean") problems.push(`${H_FINAL} is ${JSON.stringify(h[H_FINAL])}, not a boolean`);
    if (!OUTCOMES.includes(h[H_OUTCOME] as Outcome)) problems.push(`${H_OUTCOME} is ${JSON.stringify(h[H_OUTCOME])}`);
    if (H_STEP in h && !isInt(h[H_STEP])) problems.push(`${H_STEP} is ${JSON.stringify(h[H_STEP])}, not an integer`);
  }
  if (H_PROTOCOL in h && !isInt(h[H_PROTOCOL])) problems.push(`${H_PROTOCOL} is ${JSON.stringify(h[H_PROTOCOL])}, not an integer`);
  if (kind === "delta") {
    for (const name of [H_STEP, H_SEQ]) {
      if (!isInt(h[name])) problems.push(`${name} is ${JSON.stringify(h[name])}, not an integer`);
    }
  }
  if (messageId) {
    try {
      const parsed = parseMessageId(messageId);
      if ((parsed.kind === "delta") !== (kind === "delta")) {
        problems.push(`message_id ${messageId} does not fit type ${kind}`);
      } else if (parsed.sessionId !== h[H_SESSION_ID]) {
        problems.push(`message_id ${messageId} names another session`);
      }
    } catch (e) {
      problems.push((e as Error).message);
    }
  }
  if (problems.length > 0) throw new ProtocolError(problems.join("; "));
}
