"""Typed events read from a session's reply queue, and the tool types a client sends back.

`parse_event` turns one AMQP message (type property, message_id, headers, body) into a `Delta`,
`ToolCalls`, `Final`, `Failed` or `Refused`. The reply's `x-aptix-outcome` header decides the
class; the body must agree with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from . import protocol as p


@dataclass(frozen=True)
class ApiError:
    """One entry of `InvokeResult.Errors` / `Warnings`."""

    code: str
    message: str
    field: Optional[str] = None

    @staticmethod
    def from_wire(v: Mapping[str, Any]) -> "ApiError":
        return ApiError(str(v.get("Code", "")), str(v.get("Message", "")), v.get("Field"))


@dataclass(frozen=True)
class ToolCall:
    """A call the client must run; answer it with a `ToolResult` of the same `tool_call_id`."""

    tool_call_id: str
    name: str
    arguments_json: str

    @property
    def arguments(self) -> Any:
        return json.loads(self.arguments_json)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call: `result_json` or `error_message`, never both."""

    tool_call_id: str
    execution_ms: int
    result_json: Optional[str] = None
    error_message: Optional[str] = None

    @staticmethod
    def ok(call: Union[ToolCall, str], value: Any, execution_ms: int = 0) -> "ToolResult":
        """A successful result; `value` is serialised to JSON."""
        call_id = call.tool_call_id if isinstance(call, ToolCall) else call
        return ToolResult(call_id, execution_ms, result_json=json.dumps(value))

    @staticmethod
    def error(call: Union[ToolCall, str], message: str, execution_ms: int = 0) -> "ToolResult":
        call_id = call.tool_call_id if isinstance(call, ToolCall) else call
        return ToolResult(call_id, execution_ms, error_message=message)

    def to_wire(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"ToolCallId": self.tool_call_id, "ExecutionMs": self.execution_ms}
        if self.result_json is not None:
            out["ResultJson"] = self.result_json
        if self.error_message is not None:
            out["ErrorMessage"] = self.error_message
        return out


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every message on a reply queue carries."""

    message_id: str
    session_id: str
    turn_id: Optional[str]  # None when the request named no valid TurnId ("-")
    headers: Mapping[str, Any]
    body: Any
    correlation_id: Optional[str] = None

    @property
    def traceparent(self) -> Optional[str]:
        v = self.headers.get(p.H_TRACEPARENT)
        return v if isinstance(v, str) else None


@dataclass(frozen=True, kw_only=True)
class Delta(Event):
    """A streamed piece of a step's answer; `seq` orders deltas within a step."""

    step: int
    seq: int
    event: Mapping[str, Any]

    @property
    def event_type(self) -> str:
        return str(self.event.get("Type", ""))

    @property
    def text(self) -> str:
        """The text this delta adds to the answer (empty for non-text events)."""
        return str(self.event.get("Text", "")) if self.event_type == "OutputText" else ""


@dataclass(frozen=True, kw_only=True)
class Reply(Event):
    """A reply (not a delta): `final` says whether the turn is over."""

    final: bool
    outcome: str
    step: Optional[int] = None
    warnings: List[ApiError] = field(default_factory=list)

    @property
    def reply_id(self) -> p.ReplyId:
        parsed = p.parse_message_id(self.message_id)
        assert isinstance(parsed, p.ReplyId)
        return parsed

    @property
    def steered(self) -> bool:
        """True for the reply of a follow-up that steered another turn (§11, `steer`): the
        ending of the turn it steered, told about this one."""
        return any(w.code == p.CODE_TURN_STEERED for w in self.warnings)

    @property
    def resent(self) -> bool:
        """True for a stored reply sent again in answer to a duplicate submission."""
        parsed = p.parse_message_id(self.message_id)
        return isinstance(parsed, p.ReplyId) and parsed.submission_tag == "resent"

    @property
    def body_session_id(self) -> Optional[str]:
        """The body's own `SessionId` (InvokeResult): the session the reply concerns, named in
        the body too so that a logged body says which turn it answers. None when the body has
        none (the request named no valid SessionId, or a server from before the property)."""
        v = self.body.get("SessionId") if isinstance(self.body, Mapping) else None
        return v if isinstance(v, str) and v else None

    @property
    def body_turn_id(self) -> Optional[str]:
        """The body's own `TurnId` (InvokeResult), like `body_session_id`: None when the request
        named no valid TurnId or the server predates the property."""
        v = self.body.get("TurnId") if isinstance(self.body, Mapping) else None
        return v if isinstance(v, str) and v else None


@dataclass(frozen=True, kw_only=True)
class ToolCalls(Reply):
    """`client_tool_continuation`: run `calls` in order and submit their results."""

    calls: List[ToolCall]
    message: Optional[str] = None


@dataclass(frozen=True)
class ToolDecision:
    """The client's decision on one call awaiting approval (protocol v3, docs/tools.md)."""

    tool_call_id: str
    approved: bool
    message: Optional[str] = None

    @staticmethod
    def approve(call: Union[ToolCall, str]) -> "ToolDecision":
        return ToolDecision(call.tool_call_id if isinstance(call, ToolCall) else call, True)

    @staticmethod
    def deny(call: Union[ToolCall, str], message: Optional[str] = None) -> "ToolDecision":
        """A denial; `message` (at most 2,000 characters) is what the model is told."""
        return ToolDecision(call.tool_call_id if isinstance(call, ToolCall) else call, False, message)

    def to_wire(self) -> Dict[str, Any]:
        wire: Dict[str, Any] = {"ToolCallId": self.tool_call_id, "Approved": self.approved}
        if self.message is not None:
            wire["Message"] = self.message
        return wire


@dataclass(frozen=True, kw_only=True)
class ApprovalRequired(Reply):
    """`tool_approval_required`: approve or deny each of `calls` (server tools) with
    `Session.submit_approvals`, before `expires_at` (RFC 3339); undecided calls are then denied."""

    calls: List[ToolCall]
    expires_at: str
    message: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Final(Reply):
    """The turn's answer."""

    text: str
    result: Mapping[str, Any]

    @property
    def user_warnings(self) -> List[ApiError]:
        return [ApiError.from_wire(w) for w in self.result.get("UserWarnings") or []]

    @property
    def usage(self) -> Optional[Mapping[str, Any]]:
        return self.result.get("Usage")


@dataclass(frozen=True, kw_only=True)
class ErrorReply(Reply):
    """An unsuccessful InvokeResult; `errors` holds at least one entry."""

    errors: List[ApiError]

    @property
    def code(self) -> str:
        return self.errors[0].code if self.errors else ""


@dataclass(frozen=True, kw_only=True)
class Failed(ErrorReply):
    """The turn failed (`x-aptix-outcome: failed`); the session can take a new turn."""


@dataclass(frozen=True, kw_only=True)
class Refused(ErrorReply):
    """This submission was refused (`x-aptix-outcome: refused`); no turn state changed."""


AnyEvent = Union[Delta, ToolCalls, ApprovalRequired, Final, Failed, Refused]


def _outcome_from_body(body: Mapping[str, Any]) -> str:
    if not body.get("Successful"):
        return p.OUTCOME_FAILED
    kind = (body.get("Result") or {}).get("Kind")
    return kind if kind in p.WAITING_OUTCOMES else p.OUTCOME_FINAL


def parse_event(
    kind: Optional[str],
    message_id: Optional[str],
    headers: Optional[Mapping[str, Any]],
    body: bytes,
    correlation_id: Optional[str] = None,
    strict: bool = True,
) -> AnyEvent:
    """Builds the typed event of one reply-queue message.

    With `strict`, headers are checked against protocol v3 (types included) and a body that
    disagrees with the outcome header raises ProtocolError; without it, missing headers are
    inferred from the body.
    """
    headers = dict(headers or {})
    kind = kind or headers.get(p.H_KIND) or ""
    if strict:
        p.check_reply_headers(kind, message_id, headers)
    try:
        data = json.loads(body)
    except ValueError as e:
        raise p.ProtocolError(f"body of {message_id!r} is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise p.ProtocolError(f"body of {message_id!r} is not an object")
    turn = headers.get(p.H_TURN_ID)
    common: Dict[str, Any] = dict(
        message_id=message_id or "",
        session_id=str(headers.get(p.H_SESSION_ID) or data.get("SessionId") or ""),
        turn_id=None if turn in (None, p.NO_TURN) else str(turn),
        headers=headers,
        body=data,
        correlation_id=correlation_id,
    )
    if kind == p.KIND_DELTA:
        step = headers.get(p.H_STEP, data.get("Step"))
        seq = headers.get(p.H_SEQ, data.get("Seq"))
        if common["turn_id"] is None:
            common["turn_id"] = data.get("TurnId")
        return Delta(step=int(step or 0), seq=int(seq or 0), event=data.get("Event") or {}, **common)
    return _parse_reply(common, data, headers, strict)


def _parse_reply(common: Dict[str, Any], data: Mapping[str, Any], headers: Mapping[str, Any],
                 strict: bool) -> AnyEvent:
    body_turn = data.get("TurnId")
    if common["turn_id"] is None and p.H_TURN_ID not in headers and isinstance(body_turn, str) and body_turn:
        # No header (lenient mode): the body names the turn, as a delta's does.
        common = dict(common, turn_id=body_turn)
    outcome = headers.get(p.H_OUTCOME) or _outcome_from_body(data)
    final = headers.get(p.H_FINAL)
    if not isinstance(final, bool):
        final = outcome not in p.WAITING_OUTCOMES
    step = headers.get(p.H_STEP)
    reply: Dict[str, Any] = dict(
        common,
        final=final,
        outcome=outcome,
        step=step if isinstance(step, int) else None,
        warnings=[ApiError.from_wire(w) for w in data.get("Warnings") or []],
    )
    result = data.get("Result") or {}
    successful = data.get("Successful") is True
    expect_success = outcome in (p.OUTCOME_FINAL, *p.WAITING_OUTCOMES)
    if strict and successful != expect_success:
        raise p.ProtocolError(f"{common['message_id']}: outcome {outcome} but Successful={successful}")
    if strict and final != (outcome not in p.WAITING_OUTCOMES) and outcome != p.OUTCOME_REFUSED:
        raise p.ProtocolError(f"{common['message_id']}: outcome {outcome} but final={final}")
    if outcome in p.WAITING_OUTCOMES:
        calls = [
            ToolCall(str(c.get("ToolCallId")), str(c.get("Name")), str(c.get("ArgumentsJson", "")))
            for c in result.get("ToolCalls") or []
        ]
        if strict and (result.get("Kind") != outcome or not calls):
            raise p.ProtocolError(f"{common['message_id']}: {outcome} without tool calls")
        message = result.get("ToolContinuationMessage")
        if outcome == p.OUTCOME_APPROVAL:
            expires = result.get("ApprovalExpiresAt")
            if strict and not isinstance(expires, str):
                raise p.ProtocolError(f"{common['message_id']}: approval request without ApprovalExpiresAt")
            return ApprovalRequired(calls=calls, expires_at=str(expires or ""), message=message, **reply)
        return ToolCalls(calls=calls, message=message, **reply)
    if outcome == p.OUTCOME_FINAL:
        if strict and result.get("Kind") != "final":
            raise p.ProtocolError(f"{common['message_id']}: outcome final but Kind={result.get('Kind')}")
        return Final(text=str(result.get("PrimaryOutputText", "")), result=result, **reply)
    errors = [ApiError.from_wire(e) for e in data.get("Errors") or []]
    if outcome == p.OUTCOME_REFUSED:
        return Refused(errors=errors, **reply)
    return Failed(errors=errors, **reply)
