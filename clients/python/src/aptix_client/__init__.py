"""Aptix Orchestrator client (protocol v3): sessions, requests and typed reply events over RabbitMQ.

    from aptix_client import Client, ToolResult, Final, ToolCalls, Delta

    with Client("amqp://guest:guest@127.0.0.1:5672/%2f", prefix="aptix", schemas=True) as c:
        s = c.open_session()
        reply = s.run_turn("t1", "Explain the retry tiers",
                           tools=lambda call: ToolResult.ok(call, {"contents": "..."}))

`Client(..., instance="pod-1")` receives the replies of all sessions on one queue of the
instance's own (protocol §4a) instead of one queue per session; the sessions' API is the same.
`session.cancel_turn("t1")` cancels a turn (protocol §7a): it ends with its own `Failed` reply,
code `turn.cancelled`, or the cancel is `Refused` (`turn.finished`, `turn.not_found`).
`Client(..., tenant="t1")` uses the reply queues of an operator-configured tenant
(`<prefix>.session.t1.<SessionId>`, `<prefix>.instance.t1.<name>`); every request carries the
AMQP property `user_id`, the user of the broker URL.
"""

from .client import (DEFAULT_URL, Client, ConnectionLost, EventTimeout, Instance, PublishError, Session,
                     Submission, parse_urls, redact_url, shared_user, url_user)
from .events import (
    AnyEvent,
    ApiError,
    ApprovalRequired,
    Delta,
    ErrorReply,
    Event,
    Failed,
    Final,
    Refused,
    Reply,
    ToolCall,
    ToolCalls,
    ToolDecision,
    ToolResult,
    parse_event,
)
from .protocol import (
    CANCEL_TYPE,
    CODE_CONTEXT_FIXED,
    CODE_REPLY_TO_INVALID,
    CODE_SESSION_BUSY,
    CODE_SESSION_QUEUE_FULL,
    CODE_FOLLOW_UP_NOT_ALLOWED,
    CODE_SESSION_UNAVAILABLE,
    CODE_TOOL_RESULTS_TURN_CANCELLED,
    CODE_TURN_CANCELLED,
    CODE_TURN_STEERED,
    CODE_TURN_FINISHED,
    CODE_TURN_NOT_FOUND,
    H_PROTOCOL,
    OUTCOME_APPROVAL,
    LIMIT_CODES,
    PROTOCOL_VERSION,
    DeltaId,
    ProtocolError,
    ReplyId,
    instance_queue,
    is_instance_name,
    is_tenant_name,
    parse_message_id,
    requests_exchange,
    session_queue,
)
from .schemas import SchemaError, Schemas, find_schemas_dir

__all__ = [
    "AnyEvent", "ApiError", "ApprovalRequired", "CANCEL_TYPE", "OUTCOME_APPROVAL", "ToolDecision", "CODE_CONTEXT_FIXED", "CODE_REPLY_TO_INVALID",
    "CODE_SESSION_BUSY", "CODE_SESSION_QUEUE_FULL", "CODE_FOLLOW_UP_NOT_ALLOWED", "CODE_SESSION_UNAVAILABLE", "CODE_TOOL_RESULTS_TURN_CANCELLED", "CODE_TURN_CANCELLED", "CODE_TURN_STEERED",
    "CODE_TURN_FINISHED", "CODE_TURN_NOT_FOUND",
    "Client", "ConnectionLost", "DEFAULT_URL", "Delta", "DeltaId",
    "ErrorReply", "Event", "EventTimeout", "Failed", "Final", "H_PROTOCOL", "Instance", "LIMIT_CODES",
    "PROTOCOL_VERSION", "ProtocolError",
    "PublishError", "Refused", "Reply", "ReplyId", "SchemaError", "Schemas", "Session", "Submission",
    "ToolCall", "ToolCalls", "ToolResult", "find_schemas_dir", "instance_queue", "is_instance_name",
    "is_tenant_name", "parse_event", "parse_message_id", "parse_urls", "redact_url", "requests_exchange",
    "session_queue", "shared_user", "url_user",
]
