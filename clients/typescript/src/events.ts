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

export type Reply = ToolCalls | Final | Failed | Refused;
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
  return body.Result?.Kind === "client_tool_continuation" ? "client_tool_continuation" : "final";
}

/**
 * Builds the typed event of one reply-queue message. With `strict` (the default), headers are
 * checked against protocol v2, types included, and a body that disagrees with the outcome
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
  const final = typeof h[H_FINAL] === "boolean" ? (h[H_FINAL] as boolean) : outcome !== "client_tool_continuation";
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
  if (strict && successful !== (outcome === "final" || outcome === "client_tool_continuation")) {
    throw new ProtocolError(`${id}: outcome ${outcome} but Successful=${successful}`);
  }
  if (strict && outcome !== "refused" && final !== (outcome !== "client_tool_continuation")) {
    throw new ProtocolError(`${id}: outcome ${outcome} but final=${final}`);
  }
  if (outcome === "client_tool_continuation") {
    const calls: ToolCall[] = ((result.ToolCalls ?? []) as Json[]).map((c) => ({
      toolCallId: String(c.ToolCallId),
      name: String(c.Name),
      argumentsJson: String(c.ArgumentsJson ?? ""),
    }));
    if (strict && (result.Kind !== "client_tool_continuation" || calls.length === 0)) {
      throw new ProtocolError(`${id}: continuation without tool calls`);
    }
    return { ...reply, type: "tool_calls", calls, message: result.ToolContinuationMessage ?? null };
  }
  if (outcome === "final") {
    if (strict && result.Kind !== "final") throw new ProtocolError(`${id}: outcome final but Kind=${result.Kind}`);
    return { ...reply, type: "final", text: String(result.PrimaryOutputText ?? ""), result };
  }
  const errors = ((body.Errors ?? []) as Json[]).map(apiError);
  const code = errors[0]?.code ?? "";
  return outcome === "refused" ? { ...reply, type: "refused", errors, code } : { ...reply, type: "failed", errors, code };
}
