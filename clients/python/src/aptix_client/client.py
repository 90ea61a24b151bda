"""The AMQP side: a `Client` (one pika connection) and its `Session`s (one channel each).

A session follows protocol v2's reply-queue procedure literally: open a channel, enable
publisher confirms, declare `<prefix>.session.<SessionId>` durable with no arguments, consume it
with manual acks, then publish requests to the `<prefix>.requests` exchange (routing key =
SessionId, persistent, JSON, a fresh message_id, mandatory) and wait for each confirm.

pika's BlockingConnection is not thread-safe: use a client from one thread (one client per
thread otherwise). Several sessions of one client share its connection; reading events of any
session pumps the connection for all of them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import pika
import pika.exceptions

from . import protocol as p
from .events import (AnyEvent, Delta, Failed, Final, Reply, ToolCall, ToolCalls, ToolResult,
                     parse_event)
from .schemas import Schemas, find_schemas_dir

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"

#: Receives every message the client sends ("out") or accepts ("in") as a dict of
#: exchange/routing key or queue, properties, headers and body: for logs and wire captures.
WireLog = Callable[[str, Dict[str, Any]], None]
ToolHandler = Callable[[ToolCall], ToolResult]


class PublishError(Exception):
    """The broker did not take a request: returned as unroutable, or nacked."""


class EventTimeout(TimeoutError):
    """No event arrived in time."""


@dataclass(frozen=True)
class Submission:
    """A request the broker confirmed."""

    message_id: str
    session_id: str
    turn_id: Optional[str]
    body: Mapping[str, Any]


class Client:
    """One connection to RabbitMQ for one Aptix deployment (its queue-name prefix).

    `schemas`: a directory of the repository's JSON Schemas, `True` to look for one (see
    `find_schemas_dir`), or `None`/`False` for no schema checks. `strict` checks reply headers
    against protocol v2, types included.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        prefix: str = "aptix",
        *,
        schemas: Union[Schemas, str, "os.PathLike[str]", bool, None] = None,
        strict: bool = True,
        wire_log: Optional[WireLog] = None,
    ):
        self.prefix = prefix
        self.strict = strict
        self.wire_log = wire_log
        self.schemas = _load_schemas(schemas)
        self._conn = pika.BlockingConnection(pika.URLParameters(url))
        self._sessions: List["Session"] = []

    def open_session(self, session_id: Optional[str] = None) -> "Session":
        """Declares and consumes the session's reply queue; a new SessionId when none is given."""
        s = Session(self, session_id or str(uuid.uuid4()))
        self._sessions.append(s)
        return s

    def pump(self, time_limit: float) -> None:
        """Lets pika deliver what arrived, waiting up to `time_limit` seconds for something."""
        self._conn.process_data_events(time_limit=max(0.0, time_limit))

    def close(self) -> None:
        for s in list(self._sessions):
            s.close()
        if self._conn.is_open:
            self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _load_schemas(schemas: Any) -> Optional[Schemas]:
    if isinstance(schemas, Schemas):
        return schemas
    if schemas is True:
        found = find_schemas_dir()
        if found is None:
            raise FileNotFoundError("no schemas/ directory found; set APTIX_SCHEMAS_DIR")
        return Schemas(found)
    if schemas:
        return Schemas(schemas)
    return None


class Session:
    """One session: its reply queue, requests to it, and the typed events read from it.

    Events are deduplicated by `message_id`. A message is acked once the application has handled
    it, that is when it asks for the next event (or closes the session); messages not yet handed
    out go back to the queue if the channel closes.
    """

    def __init__(self, client: Client, session_id: str):
        if not p.is_session_id(session_id):
            raise ValueError(f"SessionId must be a UUID, got {session_id!r}")
        self.client = client
        self.session_id = session_id
        self.queue = p.session_queue(client.prefix, session_id)
        self._inbox: Deque[Tuple[int, Union[AnyEvent, Exception]]] = deque()
        self._handled: List[int] = []
        self.seen: Set[str] = set()
        self.duplicates_dropped = 0
        # The calls each turn waits for (from its latest ToolCalls), to order results by.
        self._pending_calls: Dict[str, List[str]] = {}
        ch = client._conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue=self.queue, durable=True, arguments={})
        self._consumer_tag = ch.basic_consume(self.queue, self._on_message, auto_ack=False)
        self._ch = ch

    # --- requests -----------------------------------------------------------------------

    def submit_turn(
        self,
        turn_id: str,
        instruction: Optional[str] = None,
        *,
        stream: Optional[bool] = None,
        message_id: Optional[str] = None,
        traceparent: Optional[str] = None,
        **fields: Any,
    ) -> Submission:
        """Publishes a user turn. Other AGN-034 properties go in `fields`, in PascalCase
        (`InputArtifacts=[...]`, `RagScope=[...]`, `Repo="..."`)."""
        body: Dict[str, Any] = {"SessionId": self.session_id, "TurnId": turn_id}
        if instruction is not None:
            body["Instruction"] = instruction
        if stream is not None:
            body["Stream"] = stream
        body.update(fields)
        return self.submit(body, message_id=message_id, traceparent=traceparent)

    def submit_tool_results(
        self,
        turn_id: str,
        results: Sequence[ToolResult],
        *,
        message_id: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> Submission:
        """Publishes a tool-result continuation. When this session received the turn's
        ToolCalls, `results` must answer exactly those calls (ValueError otherwise) and are sent
        in the order of the calls, whatever their order here."""
        body = {
            "SessionId": self.session_id,
            "TurnId": turn_id,
            "ToolResults": [r.to_wire() for r in self._in_call_order(turn_id, results)],
        }
        return self.submit(body, message_id=message_id, traceparent=traceparent)

    def submit(
        self,
        body: Union[Mapping[str, Any], bytes],
        *,
        message_id: Optional[str] = None,
        traceparent: Optional[str] = None,
        validate: bool = True,
    ) -> Submission:
        """Publishes any request body (a dict, or raw bytes sent as they are) and waits for the
        broker's confirm. Re-sending the same submission? Pass its `message_id` again."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        parsed: Any = body if not isinstance(body, bytes) else _maybe_json(body)
        if validate and self.client.schemas is not None and isinstance(body, Mapping):
            self.client.schemas.check_request(body)
        mid = message_id or str(uuid.uuid4())
        headers = {p.H_TRACEPARENT: traceparent} if traceparent else None
        props = pika.BasicProperties(
            content_type=p.CONTENT_TYPE, delivery_mode=2, message_id=mid, headers=headers
        )
        exchange = p.requests_exchange(self.client.prefix)
        try:
            self._ch.basic_publish(exchange, self.session_id, raw, props, mandatory=True)
        except pika.exceptions.UnroutableError as e:
            raise PublishError(f"{exchange} returned request {mid} as unroutable") from e
        except pika.exceptions.NackError as e:
            raise PublishError(f"the broker nacked request {mid}") from e
        if self.client.wire_log:
            self.client.wire_log("out", _wire_out(exchange, self.session_id, props, parsed))
        turn = parsed.get("TurnId") if isinstance(parsed, Mapping) else None
        return Submission(mid, self.session_id, turn if isinstance(turn, str) else None, parsed)

    def _in_call_order(self, turn_id: str, results: Sequence[ToolResult]) -> List[ToolResult]:
        expected = self._pending_calls.get(turn_id)
        if expected is None:
            return list(results)
        by_id = {r.tool_call_id: r for r in results}
        if sorted(by_id) != sorted(expected) or len(by_id) != len(results):
            raise ValueError(f"turn {turn_id} waits for results of {expected}, "
                             f"got {[r.tool_call_id for r in results]}")
        return [by_id[i] for i in expected]

    # --- events -------------------------------------------------------------------------

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        tag = method.delivery_tag
        mid = props.message_id or ""
        if mid and mid in self.seen:
            self.duplicates_dropped += 1
            ch.basic_ack(tag)
            return
        try:
            event = parse_event(props.type, props.message_id, props.headers, body,
                                props.correlation_id, strict=self.client.strict)
            schemas = self.client.schemas
            if schemas is not None:
                if isinstance(event, Delta):
                    schemas.check_delta(event.body, mid)
                else:
                    schemas.check_reply(event.body, mid)
            if event.session_id != self.session_id:
                raise p.ProtocolError(f"{mid} names session {event.session_id} on {self.queue}")
        except Exception as e:  # noqa: BLE001 - handed to the application in order
            self._inbox.append((tag, e))
            return
        if mid:
            self.seen.add(mid)
        if isinstance(event, ToolCalls) and event.turn_id:
            self._pending_calls[event.turn_id] = [c.tool_call_id for c in event.calls]
        elif isinstance(event, (Final, Failed)) and event.turn_id:
            self._pending_calls.pop(event.turn_id, None)
        if self.client.wire_log:
            self.client.wire_log("in", _wire_in(self.queue, props, event.body))
        self._inbox.append((tag, event))

    def _ack_handled(self) -> None:
        while self._handled:
            self._ch.basic_ack(self._handled.pop(0))

    def next_event(self, timeout: float = 60.0, turn_id: Optional[str] = None) -> AnyEvent:
        """The next event (of `turn_id` only, when given; others stay queued in order).

        Raises EventTimeout, or the ProtocolError / SchemaError of a message that broke the
        protocol (that message is acked: it is stored server-side).
        """
        self._ack_handled()
        deadline = time.monotonic() + timeout
        while True:
            for i, (tag, item) in enumerate(self._inbox):
                if turn_id is None or isinstance(item, Exception) or item.turn_id == turn_id:
                    del self._inbox[i]
                    self._handled.append(tag)
                    if isinstance(item, Exception):
                        raise item
                    return item
            if not self._ch.is_open:
                raise pika.exceptions.ChannelClosed(0, f"the channel of {self.queue} is closed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventTimeout(f"no event for {turn_id or 'the session'} within {timeout}s")
            self.client.pump(left)

    def events(self, timeout: float = 60.0) -> Iterator[AnyEvent]:
        """Every event of the session, as it arrives; stops when none came within `timeout`."""
        while True:
            try:
                yield self.next_event(timeout)
            except EventTimeout:
                return

    def turn_events(self, turn_id: str, timeout: float = 60.0) -> Iterator[AnyEvent]:
        """Events of one turn up to and including its next reply: `Final` / `Failed` (the turn
        is over), `Refused` (that submission was refused), or `ToolCalls` (the step is over:
        submit the results, then iterate again for the next step)."""
        while True:
            event = self.next_event(timeout, turn_id)
            yield event
            if isinstance(event, Reply):
                return

    def run_turn(
        self,
        turn_id: str,
        instruction: Optional[str] = None,
        *,
        tools: Optional[ToolHandler] = None,
        on_event: Optional[Callable[[AnyEvent], None]] = None,
        timeout: float = 60.0,
        **fields: Any,
    ) -> Reply:
        """Submits a user turn and drives it to its end: runs every requested tool call through
        `tools` (in order), submits the results, and returns the final reply (Final, Failed or
        Refused)."""
        self.submit_turn(turn_id, instruction, **fields)
        while True:
            reply: Optional[Reply] = None
            for event in self.turn_events(turn_id, timeout):
                if on_event:
                    on_event(event)
                if isinstance(event, Reply):
                    reply = event
            if not isinstance(reply, ToolCalls):
                assert reply is not None  # turn_events ends on a reply
                return reply
            if tools is None:
                raise RuntimeError(f"turn {turn_id} asks for tools and no handler was given")
            self.submit_tool_results(turn_id, [tools(c) for c in reply.calls])

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Acks handled messages and closes the channel; unread messages stay on the queue."""
        if self._ch.is_open:
            self._ack_handled()
            self._ch.close()
        if self in self.client._sessions:
            self.client._sessions.remove(self)

    def delete_queue(self) -> None:
        """Deletes the reply queue (the server re-creates it for the next admitted turn)."""
        self._ch.queue_delete(self.queue)


def _maybe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _props(props: Any) -> Dict[str, Any]:
    names = ("type", "message_id", "correlation_id", "content_type", "delivery_mode")
    return {n: getattr(props, n) for n in names if getattr(props, n, None) is not None}


def _wire_out(exchange: str, key: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"exchange": exchange, "routing_key": key, "mandatory": True,
            "properties": _props(props), "headers": dict(props.headers or {}), "body": body}


def _wire_in(queue: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"queue": queue, "properties": _props(props), "headers": dict(props.headers or {}),
            "body": body}
