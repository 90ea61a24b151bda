"""Names, header keys and the message_id grammar of the Aptix client protocol (v2).

Everything here is pure: no broker, no I/O. The rest of the package builds on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

CONTENT_TYPE = "application/json"

H_SESSION_ID = "x-aptix-session-id"
H_TURN_ID = "x-aptix-turn-id"
H_KIND = "x-aptix-kind"
H_FINAL = "x-aptix-final"
H_STEP = "x-aptix-step"
H_SEQ = "x-aptix-seq"
#: An event's place in its turn, across steps (deltas and step replies; §9a).
H_EVENT_SEQ = "x-aptix-event-seq"
H_OUTCOME = "x-aptix-outcome"
H_PROTOCOL = "x-aptix-protocol"
# The version of docs/client-protocol.md this client is written for (§1a); servers since version
# 2 send theirs in H_PROTOCOL on every reply and delta. Version 3 adds approval gates.
PROTOCOL_VERSION = 3
H_TRACEPARENT = "traceparent"

KIND_REPLY = "reply"
KIND_DELTA = "delta"
#: The notice that ends what a `turn.resume`, or a running turn's request published again, sends
#: again (§9a).
KIND_RESUMED = "resumed"

OUTCOME_FINAL = "final"
OUTCOME_CONTINUATION = "client_tool_continuation"
# Protocol version 3: server tool calls wait for the client's approval (docs/tools.md).
OUTCOME_APPROVAL = "tool_approval_required"
OUTCOME_FAILED = "failed"
OUTCOME_REFUSED = "refused"
OUTCOMES = (OUTCOME_FINAL, OUTCOME_CONTINUATION, OUTCOME_APPROVAL, OUTCOME_FAILED, OUTCOME_REFUSED)
# Outcomes after which the turn waits for the client (x-aptix-final = false).
WAITING_OUTCOMES = (OUTCOME_CONTINUATION, OUTCOME_APPROVAL)
# Refusals of decisions that came too late (§8a): the turn goes on without them.
LATE_DECISION_CODES = ("tool_approvals.expired", "turn.not_awaiting_approval")

SUBMISSION_TAGS = (
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
)

NO_TURN = "-"

#: The AMQP `type` property of a cancel (§7a): body exactly `{"SessionId", "TurnId"}`, published
#: like a request. Server messages carry `reply`, `delta` or `dead` there instead.
CANCEL_TYPE = "turn.cancel"
#: The AMQP `type` of a resume of a turn's stream (§9a).
RESUME_TYPE = "turn.resume"

#: A cancelled turn's own step reply (outcome `failed`, final): the turn was cancelled (§7a).
CODE_TURN_CANCELLED = "turn.cancelled"
#: A warning (`Warnings`) on the reply of a follow-up that steered another turn (`FollowUp:
#: "steer"`, §11): the reply is that turn's ending, told about this one.
CODE_TURN_STEERED = "turn.steered"
#: A cancel refused (`rejected-cancel-…`) because its turn had already ended (§7a).
CODE_TURN_FINISHED = "turn.finished"
#: A cancel (`rejected-cancel-…`) or a continuation (`rejected-continuation-…`) refused because
#: its turn does not exist in the session.
CODE_TURN_NOT_FOUND = "turn.not_found"
#: A request reusing a TurnId with another body (§11): the turn exists, started by that body.
CODE_TURN_CONFLICT = "turn.conflict"
#: A resume, or a copy of a running turn's request answered as one, past the session's
#: `pipeline.resumes_per_minute` (§9a, tag `rejected-resume`).
CODE_RESUMES_LIMIT = "limit.resumes_per_minute"
#: Tool results refused (`rejected-continuation-…`) because their turn was cancelled (§7a).
CODE_TOOL_RESULTS_TURN_CANCELLED = "tool_results.turn_cancelled"

#: The error code of a request whose `reply_to` names neither the session's queue nor an instance
#: queue (§4a, §10).
CODE_REPLY_TO_INVALID = "request.reply_to_invalid"

#: Tenant mode: the SessionId belongs to another tenant (a user turn, a duplicate or tool results).
CODE_SESSION_UNAVAILABLE = "session.unavailable"
#: Tenant mode: a later turn names another AgentContextId or ConversationContextId than the
#: session was created with.
CODE_CONTEXT_FIXED = "session.context_fixed"
#: The session is busy and the turn rejects follow-ups (its `FollowUp` or its mode's policy, §11).
CODE_SESSION_BUSY = "session.busy"
#: 256 turns already wait behind the session's active turn (§11, tag `rejected-busy`): nothing was
#: stored; send it again later under a new message_id.
CODE_SESSION_QUEUE_FULL = "session.queue_full"
#: The turn's `FollowUp` is one its ConversationContext does not let a request choose (§11).
CODE_FOLLOW_UP_NOT_ALLOWED = "context.follow_up_not_allowed"
#: Tenant mode: the tenant is over one of its limits and its configuration says refuse;
#: `limit.budget_exhausted` also fails a turn whose next call could pass a money budget.
LIMIT_CODES = (
    "limit.turns_in_flight",
    "limit.turns_per_minute",
    "limit.sessions_per_minute",
    "limit.tokens_per_minute",
    "limit.budget_exhausted",
)

_TURN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_SUBMISSION = re.compile(r"^(%s)-([0-9a-fA-F]{24})$" % "|".join(re.escape(t) for t in SUBMISSION_TAGS))
_STEP_TAG = re.compile(r"^step-([0-9]+)$")
_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


def requests_exchange(prefix: str) -> str:
    """The entry exchange every request is published to (routing key = SessionId)."""
    return f"{prefix}.requests"


def session_queue(prefix: str, session_id: str, tenant: Optional[str] = None) -> str:
    """A session's reply queue, declared durable with no arguments by client and server:
    `<prefix>.session.<SessionId>`, or `<prefix>.session.<tenant>.<SessionId>` for a tenant's
    session. ValueError for a tenant that is not a tenant name."""
    return f"{prefix}.session.{_tenant_segment(tenant)}{session_id}"


def instance_queue(prefix: str, instance: str, tenant: Optional[str] = None) -> str:
    """A backend instance's reply queue (§4a), declared durable with no arguments by the client;
    requests published with `reply_to` = this name get their replies there:
    `<prefix>.instance.<instance>`, or `<prefix>.instance.<tenant>.<instance>` for a tenant's
    instance. ValueError for a tenant that is not a tenant name."""
    return f"{prefix}.instance.{_tenant_segment(tenant)}{instance}"


def is_instance_name(value: str) -> bool:
    """Whether `value` is a valid instance name `I`: 1-64 characters of `[A-Za-z0-9._-]`."""
    return _INSTANCE.fullmatch(value) is not None


def is_tenant_name(value: str) -> bool:
    """Whether `value` is a valid tenant name `T`: 1-32 characters of `[a-z0-9_-]`, the first a
    lowercase letter or a digit (`^[a-z0-9][a-z0-9_-]{0,31}$`)."""
    return _TENANT.fullmatch(value) is not None


def check_tenant_name(value: str) -> str:
    """`value` when it is a valid tenant name, else ValueError saying what one is."""
    if not isinstance(value, str) or not is_tenant_name(value):
        raise ValueError("a tenant name is 1-32 characters of [a-z0-9_-] starting with a lowercase letter "
                         f"or a digit, got {value!r}")
    return value


def _tenant_segment(tenant: Optional[str]) -> str:
    """The `<tenant>.` a tenant's reply queue names carry after the mode; empty without one."""
    return "" if tenant is None else f"{check_tenant_name(tenant)}."


def message_session_id(headers: Optional[Mapping[str, Any]], body: bytes) -> Optional[str]:
    """The session a server message belongs to, as an instance queue tells them apart (§4a):
    the `x-aptix-session-id` header, else the body's `SessionId` (a delta's or a reply's own, or
    a reply's `Result.SessionId`). None when the message names none."""
    value = (headers or {}).get(H_SESSION_ID)
    if isinstance(value, str) and value:
        return value
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for holder in (data, data.get("Result")):
        if isinstance(holder, dict) and isinstance(holder.get("SessionId"), str) and holder["SessionId"]:
            return str(holder["SessionId"])
    return None


def is_turn_id(value: str) -> bool:
    return bool(_TURN_ID.match(value))


def is_session_id(value: str) -> bool:
    """Whether `value` is a UUID in its 36-character form (either case: the client writes it
    in lower case, as the server does)."""
    return isinstance(value, str) and bool(_UUID.fullmatch(value))


@dataclass(frozen=True)
class ReplyId:
    """A parsed reply `message_id`: `reply:<SessionId>:<turn>:<reply-tag>`."""

    session_id: str
    turn_id: Optional[str]  # None for "-"
    step: Optional[int]  # for `step-N`
    submission_tag: Optional[str]  # for `<tag>-<24 hex>`
    fingerprint: Optional[str]


@dataclass(frozen=True)
class DeltaId:
    """A parsed delta `message_id`: `delta:<SessionId>:<TurnId>:<step>:<seq>`."""

    session_id: str
    turn_id: str
    step: int
    seq: int


def parse_message_id(message_id: str) -> "ReplyId | DeltaId":
    """Parses a reply or delta `message_id`; raises ValueError when it breaks the grammar.

    TurnIds may contain `:`, so the id is split from both ends: the SessionId (a UUID, no `:`)
    after the first colon, the tag (no `:`) after the last one.
    """
    if message_id.startswith("reply:"):
        rest = message_id[len("reply:"):]
        session, sep, rest = rest.partition(":")
        turn, sep2, tag = rest.rpartition(":")
        if not (sep and sep2 and is_session_id(session)):
            raise ValueError(f"malformed reply id {message_id!r}")
        if turn != NO_TURN and not is_turn_id(turn):
            raise ValueError(f"bad turn in reply id {message_id!r}")
        turn_id = None if turn == NO_TURN else turn
        step_tag = _STEP_TAG.match(tag)
        if step_tag:
            if turn_id is None:
                raise ValueError(f"a step reply needs a turn: {message_id!r}")
            return ReplyId(session, turn_id, int(step_tag.group(1)), None, None)
        sub = _SUBMISSION.match(tag)
        if sub:
            return ReplyId(session, turn_id, None, sub.group(1), sub.group(2).lower())
        raise ValueError(f"unknown reply tag in {message_id!r}")
    if message_id.startswith("delta:"):
        rest = message_id[len("delta:"):]
        session, sep, rest = rest.partition(":")
        head, sep2, seq = rest.rpartition(":")
        turn, sep3, step = head.rpartition(":")
        if not (sep and sep2 and sep3 and is_session_id(session) and is_turn_id(turn)):
            raise ValueError(f"malformed delta id {message_id!r}")
        if not (step.isdigit() and seq.isdigit()):
            raise ValueError(f"bad step or seq in delta id {message_id!r}")
        return DeltaId(session, turn, int(step), int(seq))
    raise ValueError(f"unknown message id {message_id!r}")


class ProtocolError(Exception):
    """A message on the reply queue breaks protocol v3 (missing or mistyped header, bad id...)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_reply_headers(kind: str, message_id: Optional[str], headers: Mapping[str, Any]) -> None:
    """Checks the properties and headers a reply or delta must carry, with their AMQP types.

    Raises ProtocolError naming every problem found.
    """
    problems = []
    if kind not in (KIND_REPLY, KIND_DELTA):
        problems.append(f"property type is {kind!r}, not reply or delta")
    if not message_id:
        problems.append("no message_id")
    for name in (H_SESSION_ID, H_TURN_ID, H_KIND):
        if not isinstance(headers.get(name), str):
            problems.append(f"{name} is {headers.get(name)!r}, not a string")
    if headers.get(H_KIND) != kind:
        problems.append(f"{H_KIND} {headers.get(H_KIND)!r} differs from type {kind!r}")
    if kind == KIND_REPLY:
        if not isinstance(headers.get(H_FINAL), bool):
            problems.append(f"{H_FINAL} is {headers.get(H_FINAL)!r}, not a boolean")
        if headers.get(H_OUTCOME) not in OUTCOMES:
            problems.append(f"{H_OUTCOME} is {headers.get(H_OUTCOME)!r}")
        if H_STEP in headers and not _is_int(headers[H_STEP]):
            problems.append(f"{H_STEP} is {headers[H_STEP]!r}, not an integer")
    if H_PROTOCOL in headers and not _is_int(headers[H_PROTOCOL]):
        problems.append(f"{H_PROTOCOL} is {headers[H_PROTOCOL]!r}, not an integer")
    if kind == KIND_DELTA:
        for name in (H_STEP, H_SEQ):
            if not _is_int(headers.get(name)):
                problems.append(f"{name} is {headers.get(name)!r}, not an integer")
    if message_id:
        try:
            parsed = parse_message_id(message_id)
        except ValueError as e:
            problems.append(str(e))
        else:
            if isinstance(parsed, DeltaId) != (kind == KIND_DELTA):
                problems.append(f"message_id {message_id!r} does not fit type {kind!r}")
            elif parsed.session_id != headers.get(H_SESSION_ID):
                problems.append(f"message_id {message_id!r} names another session")
    if problems:
        raise ProtocolError("; ".join(problems))
