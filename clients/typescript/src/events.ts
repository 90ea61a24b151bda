/**
 * Typed events read from a session's reply queue, and the tool types a client sends back.
 * `parseEvent` turns one AMQP message into a `Delta`, `ToolCalls`, `Final`, `Failed` or
 * `Refused`; the reply's `x-aptix-outcome` header decides which, and the body must agree.
 */

import {
  CODE_TURN_STEERED,
  H_FINAL,
  H_OUTCOME,
  H_SEQ,
  H_SESSION_ID,
  H_STEP,
  H_TRACEPARENT,
  H_TURN_ID,
  Headers,
  NO_TURN,
  Outcome,
  ProtocolError,
  WAITING_OUTCOMES,
  checkReplyHeaders,
  parseMessageId,
} from "./protocol";

/** One entry of `InvokeResult.Errors` / `Warnings`. */
export interface ApiError {
  code: string;
  message: string;
  field: string | null;
}

/** A call the client must run; answer it with a ToolResult of the same toolCallId. */
export interface ToolCall {
  toolCallId: string;
  name: string;
  argumentsJson: string;
}

/** The outcome of one tool call: `resultJson` or `errorMessage`, never both. */
export interface ToolResult {
  toolCallId: string;
  executionMs: number;
  resultJson?: string;
  errorMessage?: string;
}

export const ToolResult = {
  /** A successful result; `value` is serialised to JSON. */
  ok(call: ToolCall | string, value: unknown, executionMs = 0): ToolResult {
    return { toolCallId: typeof call === "string" ? call : call.toolCallId, executionMs, resultJson: JSON.stringify(value) };
  },
  error(call: ToolCall | string, message: string, executionMs = 0): ToolResult {
    return { toolCallId: typeof call === "string" ? call : call.toolCallId, executionMs, errorMessage: message };
  },
  toWire(r: ToolResult): Record<string, unknown> {
    const out: Record<string, unknown> = { ToolCallId: r.toolCallId, ExecutionMs: r.executionMs };
    if (r.resultJson !== undefined) out.ResultJson = r.resultJson;
    if (r.errorMessage !== undefined) out.ErrorMessage = r.errorMessage;
    return out;
  },
};

/** The client's decision on one server tool call awaiting approval (protocol v3, docs/tools.md). */
export interface ToolDecision {
  toolCallId: string;
  approved: boolean;
  /** On a denial only: what the model is told (at most 2,000 characters). */
  message?: string;
}

export const ToolDecision = {
  approve(call: ToolCall | string): ToolDecision {
    return { toolCallId: typeof call === "string" ? call : call.toolCallId, approved: true };
  },
  deny(call: ToolCall | string, message?: string): ToolDecision {
    const d: ToolDecision = { toolCallId: typeof call === "string" ? call : call.toolCallId, approved: false };
    if (message !== undefined) d.message = message;
    return d;
  },
  toWire(d: ToolDecision): Record<string, unknown> {
    const out: Record<string, unknown> = { ToolCallId: d.toolCallId, Approved: d.approved };
    if (d.message !== undefined) out.Message = d.message;
    return out;
  },
};

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** What every message on a reply queue carries. */
export interface EventBase {
  messageId: string;
  sessionId: string;
  /** null when the request named no valid TurnId ("-"). */
  turnId: string | null;
  headers: Headers;
  body: Json;
  correlationId: string | null;
  traceparent: string | null;
}

/** A streamed piece of a step's answer; `seq` orders deltas within a step. */
export interface Delta extends EventBase {
  type: "delta";
  step: number;
  seq: number;
  event: Json;
  eventType: string;
  /** The text this delta adds to the answer (empty for non-text events). */
  text: string;
}

/** Common to replies; `final` says whether the turn is over. */
export interface ReplyBase extends EventBase {
  final: boolean;
  outcome: Outcome;
  step: number | null;
  warnings: ApiError[];
  /** A stored reply sent again in answer to a duplicate submission. */
  resent: boolean;
  /** The reply of a follow-up that steered another turn (§11, `steer`): that turn's ending. */
  steered: boolean;
  /**
   * The body's own `SessionId` (InvokeResult): the session the reply concerns, named in the body
   * too so that a logged body says which turn it answers. null when the body has none (the
   * request named no valid SessionId, or a server from before the property).
   */
  bodySessionId: string | null;
  /** The body's own `TurnId` (InvokeResult), like `bodySessionId`. */
  bodyTurnId: string | null;
}

/** `client_tool_continuation`: run `calls` in order and submit their results. */
export interface ToolCalls extends ReplyBase {
  type: "tool_calls";
  calls: ToolCall[];
  message: string | null;
}

/**
 * `tool_approval_required` (protocol v3): approve or deny each of `calls` (server tools) with
 * `Session.submitApprovals` before `expiresAt` (RFC 3339); undecided calls are then denied.
 */
export interface ApprovalRequired extends ReplyBase {
  type: "approval_required";
  calls: ToolCall[];
  expiresAt: string;
  message: string | null;
}

/** The turn's answer. */
export interface Final extends ReplyBase {
  type: "final";
  text: string;
  result: Json;
}

/** The turn failed; the session can take a new turn. */
export interface Failed extends ReplyBase {
  type: "failed";
  errors: ApiError[];
  code: string;
}

/** This submission was refused; no turn state changed. */
export interface Refused extends ReplyBase {
  type: "refused";
  errors: ApiError[];
  code: string;
}

export type Reply = ToolCalls | ApprovalRequired | Final | Failed | Refused;
export type AptixEvent = Delta | Reply;

/** The raw parts of one AMQP message. */
export interface RawMessage {
  type?: string;
  messageId?: string;
  correlationId?: string;
  headers?: Headers;
  body: Buffer | string;
}

const apiError = (v: Json): ApiError => ({
  code: String(v.Code ?? ""),
  message: String(v.Message ?? ""),
  field: v.Field ?? null,
});

function outcomeFromBody(body: Json): Outcome {
  if (body.Successful !== true) return "failed";
  const kind = body.Result?.Kind as Outcome | undefined;
  return kind !== undefined && WAITING_OUTCOMES.includes(kind) ? kind : "final";
}

/**
 * Builds the typed event of one reply-queue message. With `strict` (the default), headers are
 * checked against protocol v3, types included, and a body that disagrees with the outcome
 * throws ProtocolError; without it, missing headers are inferred from the body.
 */
export function parseEvent(m: RawMessage, strict = true): AptixEvent {
  const h: Headers = { ...(m.headers ?? {}) };
  const kind = m.type ?? (h["x-aptix-kind"] as string | undefined) ?? "";
  if (strict) checkReplyHeaders(kind, m.messageId, h);
  let body: Json;
  try {
    body = JSON.parse(m.body.toString());
  } catch (e) {
    throw new ProtocolError(`body of ${m.messageId} is not JSON: ${(e as Error).message}`);
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new ProtocolError(`body of ${m.messageId} is not an object`);
  }
  const turn = h[H_TURN_ID];
  const base: EventBase = {
    messageId: m.messageId ?? "",
    sessionId: String(h[H_SESSION_ID] ?? body.SessionId ?? ""),
    turnId: typeof turn === "string" && turn !== NO_TURN ? turn : null,
    headers: h,
    body,
    correlationId: m.correlationId ?? null,
    traceparent: typeof h[H_TRACEPARENT] === "string" ? (h[H_TRACEPARENT] as string) : null,
  };
  if (kind === "delta") {
    const event: Json = body.Event ?? {};
    const eventType = String(event.Type ?? "");
    return {
      ...base,
      type: "delta",
      turnId: base.turnId ?? body.TurnId ?? null,
      step: Number(h[H_STEP] ?? body.Step ?? 0),
      seq: Number(h[H_SEQ] ?? body.Seq ?? 0),
      event,
      eventType,
      text: eventType === "OutputText" ? String(event.Text ?? "") : "",
    };
  }
  return parseReply(base, body, h, strict);
}

function parseReply(base: EventBase, body: Json, h: Headers, strict: boolean): Reply {
  const outcome = (h[H_OUTCOME] as Outcome | undefined) ?? outcomeFromBody(body);
  const waits = WAITING_OUTCOMES.includes(outcome);
  const final = typeof h[H_FINAL] === "boolean" ? (h[H_FINAL] as boolean) : !waits;
  const id = base.messageId;
  let resent = false;
  try {
    const parsed = parseMessageId(id);
    resent = parsed.kind === "reply" && parsed.submissionTag === "resent";
  } catch {
    // lenient mode: an id outside the grammar is simply not a resend
  }
  const named = (v: unknown): string | null => (typeof v === "string" && v !== "" ? v : null);
  const bodyTurnId = named(body.TurnId);
  const warnings = ((body.Warnings ?? []) as Json[]).map(apiError);
  const reply = {
    ...base,
    // No header (lenient mode): the body names the turn, as a delta's does.
    turnId: base.turnId ?? (h[H_TURN_ID] === undefined ? bodyTurnId : null),
    final,
    outcome,
    step: typeof h[H_STEP] === "number" ? (h[H_STEP] as number) : null,
    warnings,
    resent,
    steered: warnings.some((w) => w.code === CODE_TURN_STEERED),
    bodySessionId: named(body.SessionId),
    bodyTurnId,
  };
  const result: Json = body.Result ?? {};
  const successful = body.Successful === true;
  if (strict && successful !== (outcome === "final" || waits)) {
    throw new ProtocolError(`${id}: outcome ${outcome} but Successful=${successful}`);
  }
  if (strict && outcome !== "refused" && final !== !waits) {
    throw new ProtocolError(`${id}: outcome ${outcome} but final=${final}`);
  }
  if (waits) {
    const calls: ToolCall[] = ((result.ToolCalls ?? []) as Json[]).map((c) => ({
      toolCallId: String(c.ToolCallId),
      name: String(c.Name),
      argumentsJson: String(c.ArgumentsJson ?? ""),
    }));
    if (strict && (result.Kind !== outcome || calls.length === 0)) {
      throw new ProtocolError(`${id}: ${outcome} without tool calls`);
    }
    const message = result.ToolContinuationMessage ?? null;
    if (outcome === "tool_approval_required") {
      if (strict && typeof result.ApprovalExpiresAt !== "string") {
        throw new ProtocolError(`${id}: approval request without ApprovalExpiresAt`);
      }
      return { ...reply, type: "approval_required", calls, expiresAt: String(result.ApprovalExpiresAt ?? ""), message };
    }
    return { ...reply, type: "tool_calls", calls, message };
  }
  if (outcome === "final") {
    if (strict && result.Kind !== "final") throw new ProtocolError(`${id}: outcome final but Kind=${result.Kind}`);
    return { ...reply, type: "final", text: String(result.PrimaryOutputText ?? ""), result };
  }
  const errors = ((body.Errors ?? []) as Json[]).map(apiError);
  const code = errors[0]?.code ?? "";
  return outcome === "refused" ? { ...reply, type: "refused", errors, code } : { ...reply, type: "failed", errors, code };
}
