"""The AMQP side: a `Client` (one pika connection) and its `Session`s (one channel each).

A session follows protocol v2's reply-queue procedure literally: open a channel, enable
publisher confirms, declare `<prefix>.session.<SessionId>` durable with no arguments, consume it
with manual acks, then publish requests to the `<prefix>.requests` exchange (routing key =
SessionId, persistent, JSON, a fresh message_id, mandatory) and wait for each confirm.

With `Client(..., instance="I")` the client follows §4a instead ("replies per instance"): it
declares `<prefix>.instance.I` (durable, no arguments) once and consumes it with manual acks,
publishes every request with `reply_to` = that queue, declares no session queue, and hands each
message to its session by the `x-aptix-session-id` header. The sessions' API is the same.

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
from typing import (Any, Callable, Deque, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set,
                    Union)

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
    #: The `reply_to` property it was published with (None: none, so the session's queue).
    reply_to: Optional[str] = None


class Client:
    """One connection to RabbitMQ for one Aptix deployment (its queue-name prefix).

    `schemas`: a directory of the repository's JSON Schemas, `True` to look for one (see
    `find_schemas_dir`), or `None`/`False` for no schema checks. `strict` checks reply headers
    against protocol v2, types included.

    `instance`: this backend instance's name `I` (1-64 characters of `[A-Za-z0-9._-]`, stable
    across restarts, unique among instances) to receive the replies of all its sessions on one
    queue, `<prefix>.instance.I` (protocol §4a); `None` (the default) for one reply queue per
    session (§4).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        prefix: str = "aptix",
        *,
        instance: Optional[str] = None,
        schemas: Union[Schemas, str, "os.PathLike[str]", bool, None] = None,
        strict: bool = True,
        wire_log: Optional[WireLog] = None,
    ):
        if instance is not None and not p.is_instance_name(instance):
            raise ValueError(f"an instance name is 1-64 characters of [A-Za-z0-9._-], got {instance!r}")
        self.prefix = prefix
        self.strict = strict
        self.wire_log = wire_log
        self.schemas = _load_schemas(schemas)
        self._conn = pika.BlockingConnection(pika.URLParameters(url))
        self._sessions: List["Session"] = []
        #: The instance queue and its dispatcher with `instance=`; None in per-session mode.
        self.instance: Optional[Instance] = None
        if instance is not None:
            try:
                self.instance = Instance(self, instance)
            except BaseException:
                self._conn.close()
                raise

    def open_session(self, session_id: Optional[str] = None) -> "Session":
        """A session; a new SessionId when none is given.

        Per session (the default): declares and consumes the session's reply queue. With an
        instance: declares nothing; the session's messages are taken from the instance queue
        (those that arrived before it was opened included). ValueError if that session is
        already open on this instance.
        """
        sid = session_id or str(uuid.uuid4())
        s = Session(self, sid) if self.instance is None else self.instance._open(sid)
        self._sessions.append(s)
        return s

    def pump(self, time_limit: float) -> None:
        """Lets pika deliver what arrived, waiting up to `time_limit` seconds for something."""
        # pika takes fractions of a second; types-pika 1.2.0b1 declares an int.
        self._conn.process_data_events(time_limit=max(0.0, time_limit))  # type: ignore[arg-type]

    def close(self) -> None:
        """Closes every session, the instance's channel (unacked messages go back to the
        queue), then the connection."""
        for s in list(self._sessions):
            s.close()
        if self.instance is not None:
            self.instance.close()
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


class _Delivery(NamedTuple):
    """One message taken from a reply queue, not yet acked: its delivery tag and raw parts."""

    tag: int
    props: Any
    body: bytes


class _Item(NamedTuple):
    """A delivery in a session's inbox, with what the application gets for it."""

    delivery: _Delivery
    item: Union[AnyEvent, Exception]


class Instance:
    """A backend instance's reply queue `<prefix>.instance.<name>` (protocol §4a) and the
    dispatcher that hands its messages to the client's sessions.

    Made by `Client(..., instance=name)`: a confirm channel, the queue declared once (durable,
    not exclusive, not auto-delete, no arguments) and consumed with manual acks. The sessions of
    the client publish on this channel with `reply_to` = the queue. Each message goes to the
    open session named by its `x-aptix-session-id` header (else the body's `SessionId`).
    Messages of a session that is not open are kept, unacked and in order, until it is opened
    (`pending_sessions()` lists them); copies of messages already handled are acked and dropped.
    """

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name
        self.queue = p.instance_queue(client.prefix, name)
        #: Copies dropped while their session was not open (open sessions count their own).
        self.duplicates_dropped = 0
        #: Messages that name no session (acked: the server stores what it sends), as errors.
        self.unroutable: List[p.ProtocolError] = []
        self._sessions: Dict[str, Session] = {}
        self._waiting: Dict[str, List[_Delivery]] = {}
        self._seen: Dict[str, Set[str]] = {}
        ch = client._conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue=self.queue, durable=True, exclusive=False, auto_delete=False, arguments={})
        ch.basic_consume(self.queue, self._on_message, auto_ack=False)
        self.channel = ch

    def pending_sessions(self) -> List[str]:
        """SessionIds with messages received for them while they were not open on this client."""
        return [sid for sid, waiting in self._waiting.items() if waiting]

    def seen(self, session_id: str) -> Set[str]:
        """The message_ids handled for a session on this instance (kept while the client lives,
        so that late copies are dropped even after the session was closed)."""
        return self._seen.setdefault(session_id, set())

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        delivery = _Delivery(method.delivery_tag, props, body)
        sid = p.message_session_id(props.headers, body)
        if sid is None:
            ch.basic_ack(delivery.tag)
            self.unroutable.append(p.ProtocolError(
                f"{props.message_id!r} on {self.queue} names no session (no {p.H_SESSION_ID})"))
            return
        session = self._sessions.get(sid)
        if session is not None:
            session._deliver(delivery)
            return
        mid = props.message_id or ""
        if mid and mid in self._seen.get(sid, ()):
            ch.basic_ack(delivery.tag)
            self.duplicates_dropped += 1
            return
        self._waiting.setdefault(sid, []).append(delivery)

    def _open(self, session_id: str) -> "Session":
        if session_id in self._sessions:
            raise ValueError(f"session {session_id} is already open on instance {self.name}")
        s = Session(self.client, session_id, instance=self)
        self._sessions[session_id] = s
        for delivery in self._waiting.pop(session_id, []):
            s._deliver(delivery)
        return s

    def _detach(self, session: "Session", unread: List[_Delivery]) -> None:
        """A session closed: what it had not handed out waits again for the next open."""
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
        if unread:
            self._waiting[session.session_id] = unread + self._waiting.get(session.session_id, [])

    def delete_queue(self) -> None:
        """Deletes the instance queue (replies published for it afterwards go to
        `<prefix>.unrouted` and stay in PostgreSQL)."""
        self.channel.queue_delete(self.queue)

    def close(self) -> None:
        """Closes the channel; unacked messages go back to the queue."""
        if self.channel.is_open:
            self.channel.close()


class Session:
    """One session: its requests and the typed events of its replies.

    Per session (§4) it owns a channel and its reply queue `<prefix>.session.<SessionId>`; with
    an instance (§4a) it publishes on the instance's channel with `reply_to` set, and its events
    come from the instance queue (`queue` is then the instance queue).

    Events are deduplicated by `message_id`. A message is acked once the application has handled
    it, that is when it asks for the next event (or closes the session); messages not yet handed
    out go back to the queue if the channel closes.
    """

    def __init__(self, client: Client, session_id: str, *, instance: Optional[Instance] = None):
        if not p.is_session_id(session_id):
            raise ValueError(f"SessionId must be a UUID, got {session_id!r}")
        self.client = client
        self.session_id = session_id
        self._instance = instance
        self._inbox: Deque[_Item] = deque()
        self._handled: List[int] = []
        self.duplicates_dropped = 0
        # The calls each turn waits for (from its latest ToolCalls), to order results by.
        self._pending_calls: Dict[str, List[str]] = {}
        if instance is not None:
            #: The queue this session's messages arrive on.
            self.queue = instance.queue
            #: The `reply_to` of this session's requests (None per session: no property).
            self.reply_to: Optional[str] = instance.queue
            self.seen: Set[str] = instance.seen(session_id)
            self._ch = instance.channel
            return
        self.queue = p.session_queue(client.prefix, session_id)
        self.reply_to = None
        self.seen = set()
        ch = client._conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue=self.queue, durable=True, arguments={})
        self._consumer_tag = ch.basic_consume(self.queue, self._on_message, auto_ack=False)
        self._ch = ch

    @property
    def instance(self) -> Optional[Instance]:
        """The instance whose queue this session reads (§4a), or None for its own queue."""
        return self._instance

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
        reply_to: Optional[str] = None,
    ) -> Submission:
        """Publishes any request body (a dict, or raw bytes sent as they are) and waits for the
        broker's confirm. Re-sending the same submission? Pass its `message_id` again.

        `reply_to`: the AMQP property to send instead of the session's own (`self.reply_to`:
        the instance queue with an instance, none otherwise); the server refuses any value but
        the session's queue or an instance queue with `request.reply_to_invalid`."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        parsed: Any = body if not isinstance(body, bytes) else _maybe_json(body)
        if validate and self.client.schemas is not None and isinstance(body, Mapping):
            self.client.schemas.check_request(body)
        mid = message_id or str(uuid.uuid4())
        headers = {p.H_TRACEPARENT: traceparent} if traceparent else None
        reply = self.reply_to if reply_to is None else reply_to
        props = pika.BasicProperties(
            content_type=p.CONTENT_TYPE, delivery_mode=2, message_id=mid, headers=headers, reply_to=reply
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
        return Submission(mid, self.session_id, turn if isinstance(turn, str) else None, parsed, reply)

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
        self._deliver(_Delivery(method.delivery_tag, props, body))

    def _deliver(self, delivery: _Delivery) -> None:
        """Takes one message of this session: drops a copy, parses and checks it, queues it."""
        tag, props, body = delivery
        mid = props.message_id or ""
        if mid and mid in self.seen:
            self.duplicates_dropped += 1
            self._ch.basic_ack(tag)
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
            self._inbox.append(_Item(delivery, e))
            return
        if mid:
            self.seen.add(mid)
        if isinstance(event, ToolCalls) and event.turn_id:
            self._pending_calls[event.turn_id] = [c.tool_call_id for c in event.calls]
        elif isinstance(event, (Final, Failed)) and event.turn_id:
            self._pending_calls.pop(event.turn_id, None)
        if self.client.wire_log:
            self.client.wire_log("in", _wire_in(self.queue, props, event.body))
        self._inbox.append(_Item(delivery, event))

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
            for i, (delivery, item) in enumerate(self._inbox):
                if turn_id is None or isinstance(item, Exception) or item.turn_id == turn_id:
                    del self._inbox[i]
                    self._handled.append(delivery.tag)
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
        """Acks handled messages and closes the channel; unread messages stay on the queue.

        With an instance, the shared channel stays open: unread messages stay unacked and go to
        this session again when it is reopened on the same client."""
        if self._instance is not None:
            if self._ch.is_open:
                self._ack_handled()
            unread = [it.delivery for it in self._inbox]
            for it in self._inbox:
                if not isinstance(it.item, Exception) and it.item.message_id:
                    self.seen.discard(it.item.message_id)  # not handled: not a copy when it comes again
            self._inbox.clear()
            self._instance._detach(self, unread)
        elif self._ch.is_open:
            self._ack_handled()
            self._ch.close()
        if self in self.client._sessions:
            self.client._sessions.remove(self)

    def delete_queue(self) -> None:
        """Deletes the reply queue (the server re-creates it for the next admitted turn).

        Not for a session of an instance, which has no queue of its own (RuntimeError): see
        `Instance.delete_queue`."""
        if self._instance is not None:
            raise RuntimeError(f"session {self.session_id} reads the instance queue {self.queue}; "
                               "it has no queue of its own to delete")
        self._ch.queue_delete(self.queue)


def _maybe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _props(props: Any) -> Dict[str, Any]:
    names = ("type", "message_id", "correlation_id", "reply_to", "content_type", "delivery_mode")
    return {n: getattr(props, n) for n in names if getattr(props, n, None) is not None}


def _wire_out(exchange: str, key: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"exchange": exchange, "routing_key": key, "mandatory": True,
            "properties": _props(props), "headers": dict(props.headers or {}), "body": body}


def _wire_in(queue: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"queue": queue, "properties": _props(props), "headers": dict(props.headers or {}),
            "body": body}
