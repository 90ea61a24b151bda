"""The AMQP side: a `Client` (one pika connection) and its `Session`s (one channel each).

A session follows protocol v3's reply-queue procedure literally: open a channel, enable
publisher confirms, declare `<prefix>.session.<SessionId>` durable with no arguments, consume it
with manual acks, then publish requests to the `<prefix>.requests` exchange (routing key =
SessionId, persistent, JSON, a fresh message_id, mandatory, `user_id` = the URL's user) and wait
for each confirm.

With `Client(..., instance="I")` the client follows §4a instead ("replies per instance"): it
declares `<prefix>.instance.I` (durable, no arguments) once and consumes it with manual acks,
publishes every request with `reply_to` = that queue, declares no session queue, and hands each
message to its session by the `x-aptix-session-id` header. The sessions' API is the same.

Tenants: every request carries the AMQP property `user_id`, the RabbitMQ user of the URL (the
broker refuses any other, so the server can trust it). With `Client(..., tenant="T")` the reply
queues carry the tenant's name: `<prefix>.session.T.<SessionId>` per session and
`<prefix>.instance.T.<name>` per instance (`reply_to` is that name); nothing else changes.

Clusters: `url` may name several broker nodes (a list, or one string of comma-separated URLs,
like the server's `amqp.url`). The client connects to a random one first and moves on to the
next when one refuses or does not answer within `connect_timeout`. When the connection is lost
it reconnects with a back-off (200 ms doubling to 5 s, reset after a long healthy connection) to
whichever node answers, declares its reply queues again and consumes them again; messages that
were delivered but not acked come again and are dropped as copies by message_id (§11). A publish
that is nacked, returned, or whose confirm was lost with its connection is sent again (same
message_id, same body) on a fresh channel, up to `publish_attempts` times (§4 step 4).

pika's BlockingConnection is not thread-safe: use a client from one thread (one client per
thread otherwise). Several sessions of one client share its connection; reading events of any
session pumps the connection for all of them.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set,
                    Tuple, TypeVar, Union)
from urllib.parse import unquote, urlsplit, urlunsplit

import pika
import pika.exceptions
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from . import protocol as p
from .events import (AnyEvent, ApprovalRequired, Delta, Failed, Final, Refused, Reply, ToolCall, ToolCalls, ToolDecision,
                     ToolResult, parse_event)
from .schemas import Schemas, find_schemas_dir

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
#: The user pika connects as when a URL names none.
DEFAULT_USER = "guest"
#: Seconds a broker node has to accept the connection and finish the AMQP handshake.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Reconnect back-off, seconds: the first delay, doubled after each failed attempt up to the second.
DEFAULT_RECONNECT_BACKOFF = (0.2, 5.0)
#: Seconds of reconnect attempts after a connection loss before `ConnectionLost` is raised.
DEFAULT_RECONNECT_TIMEOUT = 60.0
#: A connection that lived this long (seconds) resets the reconnect back-off to its first delay.
HEALTHY_AFTER = 30.0
#: Attempts of one publish (nacked, returned, or confirm lost) before `PublishError`.
DEFAULT_PUBLISH_ATTEMPTS = 6
#: Pause between publish attempts, seconds: the first, doubled up to the second.
PUBLISH_BACKOFF = (0.05, 1.0)
#: Pause between attempts to declare and consume a queue the broker stopped consuming (its node
#: down, the queue deleted), seconds: the first, doubled up to the second.
RESTORE_BACKOFF = (0.1, 5.0)
#: The broker's reply code for a queue the user may not declare or read: not tried again.
ACCESS_REFUSED = 403

#: Waits between attempts; tests replace it.
_sleep = time.sleep

#: message_ids remembered per session to drop copies: the newest this many. A copy comes from a
#: redelivery of what was not acked yet or from a re-send of something recent, while a session
#: that lives for months streams millions of ids.
SEEN_PER_SESSION = 65_536
#: Sessions an instance remembers the ids of once they are closed (the oldest forgotten first).
SEEN_CLOSED_SESSIONS = 4_096


class SeenIds:
    """The message_ids a session handled, the newest `SEEN_PER_SESSION` of them: `in`, `add`,
    `discard`, `len`."""

    def __init__(self, bound: int = SEEN_PER_SESSION):
        self._ids: "OrderedDict[str, None]" = OrderedDict()
        self._bound = bound

    def __contains__(self, mid: object) -> bool:
        return mid in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def add(self, mid: str) -> None:
        self._ids[mid] = None
        self._ids.move_to_end(mid)
        if len(self._ids) > self._bound:
            self._ids.popitem(last=False)

    def discard(self, mid: str) -> None:
        self._ids.pop(mid, None)

#: Receives every message the client sends ("out") or accepts ("in") as a dict of
#: exchange/routing key or queue, properties, headers and body: for logs and wire captures.
WireLog = Callable[[str, Dict[str, Any]], None]
ToolHandler = Callable[[ToolCall], ToolResult]
# Says whether a server tool call that needs approval may run: True, False, or a ToolDecision
# (a denial with a message for the model).
ApprovalHandler = Callable[[ToolCall], Union[bool, ToolDecision]]
_Answer = TypeVar("_Answer", ToolResult, ToolDecision)


class PublishError(Exception):
    """The broker did not take a request: returned as unroutable, nacked, or its confirm was lost,
    on every one of the client's `publish_attempts`."""


class ConnectionLost(pika.exceptions.AMQPConnectionError):
    """The connection was lost and no broker node took a new one within `reconnect_timeout`."""


def parse_urls(url: Union[str, Sequence[str]]) -> List[str]:
    """The broker node URLs of `url`: one URL, a comma-separated string of them, or a list (whose
    items may themselves be comma-separated). ValueError when none is left."""
    items = [url] if isinstance(url, str) else list(url)
    urls = [u.strip() for item in items for u in item.split(",") if u.strip()]
    if not urls:
        raise ValueError("no broker URL given")
    return urls


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***` (for logs and errors)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
    except ValueError:
        return "<unparsable URL>"


def url_user(url: str) -> str:
    """The RabbitMQ user an AMQP URL connects as: its username, percent-decoded as pika decodes
    it (`amqp://a%40b:pw@host/` -> `a@b`), or pika's default `guest` when it names none.
    ValueError when the URL cannot be parsed."""
    try:
        user = urlsplit(url).username
    except ValueError as e:
        raise ValueError(f"not an AMQP URL: {redact_url(url)}") from e
    return DEFAULT_USER if user is None else unquote(user)


def shared_user(urls: Sequence[str]) -> str:
    """The one RabbitMQ user of a cluster's node URLs (the `user_id` of every request);
    ValueError when they name different users."""
    users = sorted({url_user(u) for u in urls})
    if len(users) != 1:
        raise ValueError(f"the broker URLs name different users ({', '.join(map(repr, users))}); "
                         "the nodes of one client share one user")
    return users[0]


def _connection_params(url: str, timeout: float, name: str) -> pika.URLParameters:
    params = pika.URLParameters(url)
    query = urlsplit(url).query
    if "socket_timeout=" not in query:
        params.socket_timeout = timeout
    if "stack_timeout=" not in query:
        params.stack_timeout = timeout
    params.client_properties = {"connection_name": name}
    return params


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
    #: How many times it was published before the broker confirmed it (1 unless resent).
    attempts: int = 1
    #: The AMQP `type` property it was published with: `turn.cancel` for a cancel (§7a), None
    #: for a request (user turn or tool results).
    kind: Optional[str] = None


class Client:
    """One connection to RabbitMQ for one Aptix deployment (its queue-name prefix).

    `schemas`: a directory of the repository's JSON Schemas, `True` to look for one (see
    `find_schemas_dir`), or `None`/`False` for no schema checks. `strict` checks reply headers
    against protocol v3, types included.

    `instance`: this backend instance's name `I` (1-64 characters of `[A-Za-z0-9._-]`, stable
    across restarts, unique among instances) to receive the replies of all its sessions on one
    queue, `<prefix>.instance.I` (protocol §4a); `None` (the default) for one reply queue per
    session (§4).

    `tenant`: the name `T` of the operator-configured tenant this client's RabbitMQ user belongs
    to (1-32 characters of `[a-z0-9_-]`, starting with a letter or digit): its reply queues are
    then `<prefix>.session.T.<SessionId>` or `<prefix>.instance.T.<instance>`, the only ones the
    tenant's user may declare and read. `None` (the default): no tenant, the names of §4 / §4a.
    Every request carries `user_id` = the URL's user either way (`client.user_id`).

    `url`: one broker URL, a string of comma-separated URLs (the nodes of a cluster), or a list
    of them. `connect_timeout`: seconds a node has to take the connection before the next is
    tried (unless the URL sets `socket_timeout` / `stack_timeout` itself). `connection_name`:
    the name the broker shows for the connection (default `aptix-client <prefix>`).
    `reconnect`: reconnect when the connection is lost (default True) with a back-off of
    `reconnect_backoff` (first and longest delay, seconds) for up to `reconnect_timeout` seconds,
    then raise `ConnectionLost`; False raises pika's error at once, as before.
    `publish_attempts`: how many times a request is published (same message_id) before
    `PublishError` when it is nacked, returned, or its confirm is lost.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str]] = DEFAULT_URL,
        prefix: str = "aptix",
        *,
        instance: Optional[str] = None,
        tenant: Optional[str] = None,
        schemas: Union[Schemas, str, "os.PathLike[str]", bool, None] = None,
        strict: bool = True,
        wire_log: Optional[WireLog] = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        connection_name: Optional[str] = None,
        reconnect: bool = True,
        reconnect_backoff: Tuple[float, float] = DEFAULT_RECONNECT_BACKOFF,
        reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
        publish_attempts: int = DEFAULT_PUBLISH_ATTEMPTS,
    ):
        if instance is not None and not p.is_instance_name(instance):
            raise ValueError(f"an instance name is 1-64 characters of [A-Za-z0-9._-], got {instance!r}")
        if tenant is not None:
            p.check_tenant_name(tenant)
        if publish_attempts < 1:
            raise ValueError("publish_attempts must be at least 1")
        self.urls = parse_urls(url)
        #: The RabbitMQ user of `urls`, sent as the `user_id` property of every request.
        self.user_id = shared_user(self.urls)
        self.prefix = prefix
        #: The tenant whose reply queue names this client uses, or None.
        self.tenant = tenant
        self.strict = strict
        self.wire_log = wire_log
        self.connect_timeout = connect_timeout
        self.connection_name = connection_name or f"aptix-client {prefix}"
        self.reconnect = reconnect
        self.reconnect_backoff = reconnect_backoff
        self.reconnect_timeout = reconnect_timeout
        self.publish_attempts = publish_attempts
        #: The index in `urls` of the node of the current connection.
        self.node = 0
        #: How many times the client reconnected after losing its connection.
        self.reconnects = 0
        self._delay = reconnect_backoff[0]
        self._connected_at = time.monotonic()
        self._closed = False
        self.schemas = _load_schemas(schemas)
        self._conn = self._connect()
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
        if p.is_session_id(sid):
            # The server writes SessionIds in lower case (§1): a GUID spelt in upper case would
            # declare a queue no reply reaches.
            sid = sid.lower()
        try:
            s = Session(self, sid) if self.instance is None else self.instance._open(sid)
        except pika.exceptions.AMQPConnectionError as e:
            self._recover(e)
            s = Session(self, sid) if self.instance is None else self.instance._open(sid)
        self._sessions.append(s)
        return s

    def pump(self, time_limit: float) -> None:
        """Lets pika deliver what arrived, waiting up to `time_limit` seconds for something.
        A lost connection is taken again first (see `reconnect`)."""
        try:
            if not self._closed and not self._conn.is_open:
                raise pika.exceptions.ConnectionWrongStateError("the connection is closed")
            # pika takes fractions of a second; types-pika 1.2.0b1 declares an int.
            self._conn.process_data_events(time_limit=max(0.0, time_limit))  # type: ignore[arg-type]
        except pika.exceptions.AMQPConnectionError as e:
            self._recover(e)

    def _connect(self) -> pika.BlockingConnection:
        """A connection to the first node that takes one, trying them all from a random one."""
        start = random.randrange(len(self.urls))
        errors: List[str] = []
        for i in range(len(self.urls)):
            k = (start + i) % len(self.urls)
            params = _connection_params(self.urls[k], self.connect_timeout, self.connection_name)
            try:
                conn = pika.BlockingConnection(params)
            except (pika.exceptions.AMQPConnectionError, AMQPConnectorException, OSError) as e:
                errors.append(f"{redact_url(self.urls[k])}: {e!r}")
                continue
            self.node = k
            self._connected_at = time.monotonic()
            return conn
        raise pika.exceptions.AMQPConnectionError("no broker node took the connection: " + "; ".join(errors))

    def _recover(self, cause: BaseException) -> None:
        """The connection is lost: connect again (back-off, any node), declare and consume every
        reply queue again. Raises `cause` without `reconnect` or once closed, `ConnectionLost`
        after `reconnect_timeout`."""
        if self._closed or not self.reconnect:
            raise cause
        now = time.monotonic()
        if now - self._connected_at >= HEALTHY_AFTER:
            self._delay = self.reconnect_backoff[0]
        give_up = now + self.reconnect_timeout
        last: BaseException = cause
        while True:
            _close_quietly(self._conn)
            if time.monotonic() >= give_up:
                raise ConnectionLost(f"the connection was lost ({cause!r}) and no broker node took a new one "
                                     f"within {self.reconnect_timeout}s; last error: {last!r}") from last
            _sleep(self._delay)
            self._delay = min(self._delay * 2, self.reconnect_backoff[1])
            try:
                self._conn = self._connect()
                if self.instance is not None:
                    _reopen_or_later(self.instance)
                else:
                    for s in self._sessions:
                        _reopen_or_later(s)
            except pika.exceptions.AMQPError as e:
                last = e
                continue
            self.reconnects += 1
            return

    def close(self) -> None:
        """Closes every session, the instance's channel (unacked messages go back to the
        queue), then the connection."""
        self._closed = True
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


def _reopen_or_later(holder: Any) -> None:
    """Declares and consumes a session's or instance's queue again after a reconnect. A queue
    the broker cannot declare now (404: its node is down) is that queue's trouble, not the
    connection's: its channel stays closed and its next `next_event` tries again."""
    try:
        holder._reopen()
    except pika.exceptions.AMQPChannelError:
        pass


def _event_seq(event: Any) -> Optional[int]:
    """An event's `x-aptix-event-seq`, when it has one."""
    n = (getattr(event, "headers", None) or {}).get(p.H_EVENT_SEQ)
    return n if isinstance(n, int) else None


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
    """One message taken from a reply queue, not yet acked: its delivery tag and raw parts, and
    the channel that delivered it (its tag means nothing on another)."""

    tag: int
    props: Any
    body: bytes
    channel: Any = None


def _ack(delivery: _Delivery, channel: Any = None) -> None:
    """Acks a delivery on its channel. When that channel is gone (connection lost, channel
    replaced), the broker delivers the message again and the copy is dropped by message_id."""
    ch = delivery.channel if delivery.channel is not None else channel
    if ch is None or not ch.is_open:
        return
    try:
        ch.basic_ack(delivery.tag)
    except pika.exceptions.AMQPError:
        pass


def _close_quietly(thing: Any) -> None:
    """Closes a channel or connection that may already be closed or dead."""
    try:
        if thing is not None and thing.is_open:
            thing.close()
    except Exception:  # noqa: BLE001 - it is being dropped anyway
        pass


class _Item(NamedTuple):
    """A delivery in a session's inbox, with what the application gets for it."""

    delivery: _Delivery
    item: Union[AnyEvent, Exception]


class Instance:
    """A backend instance's reply queue `<prefix>.instance.<name>` (protocol §4a), or
    `<prefix>.instance.<tenant>.<name>` with a tenant, and the dispatcher that hands its messages
    to the client's sessions.

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
        # getattr: stand-ins for a Client in tests may have no tenant.
        self.queue = p.instance_queue(client.prefix, name, getattr(client, "tenant", None))
        #: Copies dropped while their session was not open (open sessions count their own).
        self.duplicates_dropped = 0
        #: Messages that name no session (acked: the server stores what it sends), as errors.
        self.unroutable: List[p.ProtocolError] = []
        self._sessions: Dict[str, Session] = {}
        self._waiting: Dict[str, List[_Delivery]] = {}
        self._seen: Dict[str, SeenIds] = {}
        self.channel: Any = None
        #: Whether the broker cancelled the consumer of the current channel.
        self.cancelled = False
        self._open_channel()

    def _open_channel(self) -> None:
        ch = self.client._conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue=self.queue, durable=True, exclusive=False, auto_delete=False, arguments={})
        ch.add_on_cancel_callback(lambda _frame: self._on_cancel(ch))
        ch.basic_consume(self.queue, self._on_message, auto_ack=False)
        self.channel = ch
        self.cancelled = False

    def _on_cancel(self, ch: Any) -> None:
        """The broker cancelled the consumer (the queue was deleted, or its node lost): the next
        `next_event` of a session declares and consumes the queue again."""
        if ch is self.channel:
            self.cancelled = True

    def _reopen(self) -> None:
        """A fresh channel (after a reconnect, or instead of one that nacked): the queue declared
        and consumed again. Messages of the old channel not acked come again, so those kept for
        sessions not open are forgotten; copies of handed-out ones are dropped by message_id."""
        _close_quietly(self.channel)
        self._waiting.clear()
        self._open_channel()

    def pending_sessions(self) -> List[str]:
        """SessionIds with messages received for them while they were not open on this client."""
        return [sid for sid, waiting in self._waiting.items() if waiting]

    def seen(self, session_id: str) -> SeenIds:
        """The message_ids handled for a session on this instance (kept after the session
        closed, so that late copies are dropped, for the newest `SEEN_CLOSED_SESSIONS` closed
        sessions)."""
        ids = self._seen.get(session_id)
        if ids is None:
            ids = self._seen[session_id] = SeenIds()
            closed = [sid for sid in self._seen if sid not in self._sessions and sid != session_id]
            for sid in closed[:max(0, len(closed) - SEEN_CLOSED_SESSIONS)]:
                del self._seen[sid]
        return ids

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        delivery = _Delivery(method.delivery_tag, props, body, ch)
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
        if session.session_id in self._seen:
            # Closed now: the newest closed session, the last its ids are forgotten.
            self._seen[session.session_id] = self._seen.pop(session.session_id)
        if unread:
            self._waiting[session.session_id] = unread + self._waiting.get(session.session_id, [])

    def delete_queue(self) -> None:
        """Deletes the instance queue (replies published for it afterwards go to
        `<prefix>.unrouted` (with tenants, `<prefix>.unrouted.<tenant>`) and stay in PostgreSQL)."""
        self.channel.queue_delete(self.queue)

    def close(self) -> None:
        """Closes the channel; unacked messages go back to the queue."""
        if self.channel.is_open:
            self.channel.close()


class Session:
    """One session: its requests and the typed events of its replies.

    Per session (§4) it owns a channel and its reply queue `<prefix>.session.<SessionId>`
    (`<prefix>.session.<tenant>.<SessionId>` with a tenant); with an instance (§4a) it publishes
    on the instance's channel with `reply_to` set, and its events come from the instance queue
    (`queue` is then the instance queue).

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
        self._handled: List[_Delivery] = []
        self._own_ch: Any = None
        self.duplicates_dropped = 0
        # The calls each turn waits for (from its latest ToolCalls), to order results by.
        self._pending_calls: Dict[str, List[str]] = {}
        # Streamed turns not yet over: the last x-aptix-event-seq handed out (-1: none yet).
        self._streaming: Dict[str, int] = {}
        # The message_id of the request that started each tracked turn: its refusal (nothing
        # stored: busy, limited, invalid) ends the tracking too.
        self._started_by: Dict[str, str] = {}
        # Turns being resumed (§9a): the cursor sent, their events held until the notice, and
        # the resume's message_id, which the notice (or a refusal) names as its correlation_id.
        self._resuming: Dict[str, Tuple[int, List[_Item], str]] = {}
        #: How many times this session resumed a turn's stream by itself after a reconnect.
        self.resumes = 0
        #: How many times it declared and consumed its queue again while connected (§4 step 2),
        #: its channel closed or its consumer cancelled by the broker.
        self.restores = 0
        self._restore_delay = RESTORE_BACKOFF[0]
        self._cancelled = False
        # message_ids of the resumes this session sent by itself, the newest 256: their
        # refusals are its own (kept when a publish failed: an earlier attempt may have gone).
        self._auto_resumes = SeenIds(bound=256)
        if instance is not None:
            #: The queue this session's messages arrive on.
            self.queue = instance.queue
            #: The `reply_to` of this session's requests (None per session: no property).
            self.reply_to: Optional[str] = instance.queue
            self.seen: SeenIds = instance.seen(session_id)
            return
        self.queue = p.session_queue(client.prefix, session_id, getattr(client, "tenant", None))
        self.reply_to = None
        self.seen = SeenIds()
        self._open_channel()

    @property
    def _ch(self) -> Any:
        """The channel this session publishes, consumes and acks on (the instance's, with one)."""
        return self._instance.channel if self._instance is not None else self._own_ch

    def _open_channel(self) -> None:
        ch = self.client._conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue=self.queue, durable=True, arguments={})
        ch.add_on_cancel_callback(lambda _frame: self._on_cancel(ch))
        self._consumer_tag = ch.basic_consume(self.queue, self._on_message, auto_ack=False)
        self._own_ch = ch
        self._cancelled = False

    def _on_cancel(self, ch: Any) -> None:
        """The broker cancelled the consumer (the queue was deleted, or its node lost): the next
        `next_event` declares and consumes the queue again."""
        if ch is self._own_ch:
            self._cancelled = True

    def _consuming_lost(self) -> bool:
        """Whether this session's queue is no longer consumed while the connection lives: the
        broker closed the channel (an ack it did not know, its consumer timeout, a declaration
        it refused) or cancelled the consumer."""
        if self._instance is not None:
            return not self._instance.channel.is_open or self._instance.cancelled
        return not self._own_ch.is_open or self._cancelled

    def _restore(self, deadline: float) -> None:
        """Declares and consumes the queue again, as after a reconnect (streamed turns resumed).
        A queue the broker cannot declare yet (404: its node is down) is tried again with
        back-off, up to `deadline`."""
        try:
            self._reopen()
            self._restore_delay = RESTORE_BACKOFF[0]
            self.restores += 1
        except pika.exceptions.AMQPChannelError as e:
            if getattr(e, "reply_code", None) == ACCESS_REFUSED:
                raise  # the user may not declare or read this queue: waiting changes nothing
            _sleep(max(0.0, min(self._restore_delay, deadline - time.monotonic())))
            self._restore_delay = min(self._restore_delay * 2, RESTORE_BACKOFF[1])
        except pika.exceptions.AMQPConnectionError as e:
            self.client._recover(e)

    def _reopen(self) -> None:
        """A fresh channel (after a reconnect, or instead of one that nacked): the queue declared
        and consumed again. Messages not acked on the old one come again; the copies of those
        already taken are dropped by message_id, and errors not yet read are dropped (they come
        again too)."""
        if self._instance is not None:
            self._instance._reopen()
            return
        old = self._own_ch
        _close_quietly(old)
        self._inbox = deque(it for it in self._inbox
                            if not (isinstance(it.item, Exception) and it.delivery.channel is old))
        self._open_channel()
        # What was published while the queue was gone (its node down, deleted) is not in it:
        # streamed turns still running are resumed from the last event handed out.
        for turn_id, last in list(self._streaming.items()):
            if turn_id not in self._resuming:
                self._resume_by_itself(turn_id, last)

    def _resume_by_itself(self, turn_id: str, last: int) -> None:
        """A resume the client sends on its own: its refusal is not the application's (a turn
        not admitted yet when its request is sent again, a session resumed too often), and its
        failure to publish leaves the turn tracked, to be resumed at the next reconnect."""
        self.resumes += 1
        try:
            self.resume_turn(turn_id, after=last if last >= 0 else None, _auto=True)
        except (PublishError, pika.exceptions.AMQPChannelError):
            pass

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
        mid = message_id or str(uuid.uuid4())
        track = stream and self._instance is None and turn_id not in self._streaming
        if track:
            # Tracked before the publish: its first events may arrive while the confirm is awaited.
            self._streaming[turn_id] = -1
            self._started_by[turn_id] = mid
        try:
            return self.submit(body, message_id=mid, traceparent=traceparent)
        except BaseException:
            if track:
                self._untrack(turn_id)
            raise

    def _untrack(self, turn_id: str) -> None:
        self._streaming.pop(turn_id, None)
        self._started_by.pop(turn_id, None)

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

    def submit_approvals(
        self,
        turn_id: str,
        decisions: Sequence[ToolDecision],
        *,
        message_id: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> Submission:
        """Publishes a Tool Approval Submission (protocol v3): a decision for each call of the
        turn's `tool_approval_required` reply. When this session received that reply, `decisions`
        must name exactly its calls (ValueError otherwise) and are sent in the order of the calls.
        Sent again with the same `message_id`, it changes nothing more: an approved call runs once."""
        body = {
            "SessionId": self.session_id,
            "TurnId": turn_id,
            "ToolApprovals": [d.to_wire() for d in self._in_call_order(turn_id, decisions, "decisions on")],
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
        kind: Optional[str] = None,
    ) -> Submission:
        """Publishes any request body (a dict, or raw bytes sent as they are) and waits for the
        broker's confirm. Re-sending the same submission? Pass its `message_id` (and `kind`)
        again.

        `reply_to`: the AMQP property to send instead of the session's own (`self.reply_to`:
        the instance queue with an instance, none otherwise); the server refuses any value but
        the session's queue or an instance queue with `request.reply_to_invalid`.

        `kind`: the AMQP `type` property; `turn.cancel` (`CANCEL_TYPE`) publishes a cancel
        (§7a, see `cancel_turn`), whose body is not an AGN-034 request and is never checked
        against the request schema. None (the default): no `type`, a request.

        Every request carries `user_id` = the client's `user_id` (the URL's user)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        parsed: Any = body if not isinstance(body, bytes) else _maybe_json(body)
        schemas = self.client.schemas
        if validate and kind != p.CANCEL_TYPE and schemas is not None and isinstance(body, Mapping):
            schemas.check_request(body)
        mid = message_id or str(uuid.uuid4())
        headers = {p.H_TRACEPARENT: traceparent} if traceparent else None
        reply = self.reply_to if reply_to is None else reply_to
        props = pika.BasicProperties(
            content_type=p.CONTENT_TYPE, delivery_mode=2, message_id=mid, headers=headers, reply_to=reply,
            user_id=getattr(self.client, "user_id", None),  # stand-ins in tests may have none
            type=kind,
        )
        exchange = p.requests_exchange(self.client.prefix)
        attempts = self._publish(exchange, raw, props, mid)
        if self.client.wire_log:
            self.client.wire_log("out", _wire_out(exchange, self.session_id, props, parsed))
        turn = parsed.get("TurnId") if isinstance(parsed, Mapping) else None
        return Submission(mid, self.session_id, turn if isinstance(turn, str) else None, parsed, reply,
                          attempts, kind)

    def cancel_turn(
        self,
        turn_id: str,
        *,
        message_id: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> Submission:
        """Publishes a cancel of turn `turn_id` (protocol §7a) and waits for the broker's confirm:
        `{"SessionId", "TurnId"}` with the AMQP `type` = `turn.cancel`, like any request
        (persistent, JSON, mandatory, `user_id`, `reply_to` with an instance).

        A turn that is queued, running or waiting for tool results then ends with its own step
        reply, a `Failed` with code `turn.cancelled` (read it with `turn_events(turn_id)` or
        `next_event`); no delta of it follows. A turn that already ended gets a `Refused` with
        code `turn.finished`, an unknown one `turn.not_found` (id tag `rejected-cancel`,
        `correlation_id` = this cancel's message_id); a repeated cancel gets nothing. Tool results
        sent for a cancelled turn are refused with `tool_results.turn_cancelled`."""
        body = {"SessionId": self.session_id, "TurnId": turn_id}
        return self.submit(body, message_id=message_id, traceparent=traceparent, validate=False,
                           kind=p.CANCEL_TYPE)

    def resume_turn(self, turn_id: str, *, after: Optional[int] = None, _auto: bool = False) -> Submission:
        """Publishes a resume of turn `turn_id`'s stream (protocol §9a) after event `after` (an
        `x-aptix-event-seq`; everything when None). The turn's events are then held until the
        server's `resumed` notice and handed out in event order, each once. The client does this
        by itself after a reconnect for every streamed turn not yet over."""
        body: Dict[str, Any] = {"SessionId": self.session_id, "TurnId": turn_id}
        if after is not None:
            body["AfterSeq"] = after
        mid = str(uuid.uuid4())
        self._resuming[turn_id] = (-1 if after is None else after, [], mid)
        if _auto:
            self._auto_resumes.add(mid)
        try:
            return self.submit(body, message_id=mid, validate=False, kind=p.RESUME_TYPE)
        except BaseException:
            self._release(turn_id)
            raise

    def _publish(self, exchange: str, raw: bytes, props: pika.BasicProperties, mid: str) -> int:
        """Publishes until the broker confirms (§4 step 4): a return or a nack is sent again (a
        nacking or closed channel is replaced by a fresh one), a confirm lost with the connection
        is sent again after reconnecting. Returns the attempts; PublishError after the last."""
        limit = getattr(self.client, "publish_attempts", DEFAULT_PUBLISH_ATTEMPTS)
        delay = PUBLISH_BACKOFF[0]
        attempt = 0
        while True:
            attempt += 1
            lost: Optional[BaseException] = None
            cause: BaseException
            fresh = False
            try:
                self._ch.basic_publish(exchange, self.session_id, raw, props, mandatory=True)
                return attempt
            except pika.exceptions.UnroutableError as e:
                why, cause = f"{exchange} returned request {mid} as unroutable", e
            except pika.exceptions.NackError as e:
                why, cause, fresh = f"the broker nacked request {mid}", e, True
            except pika.exceptions.AMQPChannelError as e:
                why, cause, fresh = f"the channel closed before request {mid} was confirmed ({e!r})", e, True
            except pika.exceptions.AMQPConnectionError as e:
                why, cause, lost = f"the connection was lost before request {mid} was confirmed ({e!r})", e, e
            if attempt >= limit:
                raise PublishError(f"{why} (gave up after {attempt} attempts)") from cause
            if fresh and not self.client._conn.is_open:
                lost = cause
            if lost is not None:
                self.client._recover(lost)  # its back-off is the wait
                continue
            _sleep(delay)
            delay = min(delay * 2, PUBLISH_BACKOFF[1])
            if fresh:
                try:
                    self._reopen()
                except pika.exceptions.AMQPConnectionError as e:
                    self.client._recover(e)

    def _in_call_order(self, turn_id: str, answers: Sequence[_Answer], what: str = "results of") -> List[_Answer]:
        expected = self._pending_calls.get(turn_id)
        if expected is None:
            return list(answers)
        by_id = {a.tool_call_id: a for a in answers}
        if sorted(by_id) != sorted(expected) or len(by_id) != len(answers):
            raise ValueError(f"turn {turn_id} waits for {what} {expected}, "
                             f"got {[a.tool_call_id for a in answers]}")
        return [by_id[i] for i in expected]

    # --- events -------------------------------------------------------------------------

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self._deliver(_Delivery(method.delivery_tag, props, body, ch))

    def _deliver(self, delivery: _Delivery) -> None:
        """Takes one message of this session: drops a copy, parses and checks it, queues it."""
        mid = delivery.props.message_id or ""
        props, body = delivery.props, delivery.body
        if props.type == p.KIND_RESUMED:
            self._resumed(delivery)
            return
        if mid and mid in self.seen:
            self.duplicates_dropped += 1
            _ack(delivery, self._ch)
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
        if isinstance(event, (ToolCalls, ApprovalRequired)) and event.turn_id:
            self._pending_calls[event.turn_id] = [c.tool_call_id for c in event.calls]
        elif isinstance(event, (Final, Failed)) and event.turn_id:
            self._pending_calls.pop(event.turn_id, None)
        if self.client.wire_log:
            self.client.wire_log("in", _wire_in(self.queue, props, event.body))
        held = self._resuming.get(event.turn_id or "")
        answers = getattr(event, "correlation_id", None)
        if held is not None and answers == held[2]:
            # The resume itself was refused (an unknown turn): no notice comes.
            self._release(event.turn_id or "")
        if answers in self._auto_resumes and isinstance(event, Refused):
            # A resume the client sent by itself was refused: nothing of the application's
            # ended, and the turn stays tracked (its events still come live).
            self._auto_resumes.discard(answers)
            _ack(delivery, self._ch)
            return
        if held is not None and answers != held[2]:
            held[1].append(_Item(delivery, event))
            return
        self._hand_out(_Item(delivery, event))

    def _hand_out(self, item: "_Item") -> None:
        """Queues an event for the application, noting how far its turn's stream got."""
        event = item.item
        turn = getattr(event, "turn_id", None)
        if turn in self._streaming:
            n = _event_seq(event)
            if n is not None:
                self._streaming[turn] = max(self._streaming[turn], n)
            # A refusal is final for its submission only (§6): the turn ends with Final or
            # Failed, or never starts when the request that started it is refused.
            started_by = self._started_by.get(turn)
            # ... except when the refusal says the turn exists: a copy of the request answered
            # as an attach past the resume limit, or a TurnId another body already started.
            refused_start = (isinstance(event, Refused) and started_by is not None
                             and event.correlation_id == started_by
                             and event.code not in (p.CODE_TURN_CONFLICT, p.CODE_RESUMES_LIMIT))
            if isinstance(event, (Final, Failed)) or refused_start:
                self._untrack(turn)
        self._inbox.append(item)

    def _resumed(self, delivery: "_Delivery") -> None:
        """A `resumed` notice (§9a): the turn's held events go out in event order, after the
        cursor, each once; a notice this session did not ask for ends nothing."""
        _ack(delivery, self._ch)
        try:
            notice = json.loads(delivery.body)
            turn = notice.get("TurnId")
        except (ValueError, AttributeError):
            return
        held = self._resuming.get(turn)
        self._auto_resumes.discard(delivery.props.correlation_id)
        # Another resume's notice (an attach, another process's) ends nothing of this one.
        if held is not None and delivery.props.correlation_id == held[2]:
            self._release(turn)
            if notice.get("Ended") is True:
                # Its end was among what came again (or handed out before): nothing live follows.
                self._untrack(turn)

    def _release(self, turn: str) -> None:
        """Hands out a resumed turn's held events: in event order, after the cursor."""
        after, held, _ = self._resuming.pop(turn, (None, [], ""))
        for item in sorted(held, key=lambda it: _event_seq(it.item) or 0):
            n = _event_seq(item.item)
            if after is not None and n is not None and n <= after:
                _ack(item.delivery, self._ch)
                continue
            self._hand_out(item)

    def _ack_handled(self) -> None:
        while self._handled:
            _ack(self._handled.pop(0), self._ch)

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
                    self._handled.append(delivery)
                    if isinstance(item, Exception):
                        raise item
                    return item
            lost = self._consuming_lost() and self.client._conn.is_open
            if lost:
                self._restore(deadline)
                lost = self._consuming_lost()
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventTimeout(f"no event for {turn_id or 'the session'} within {timeout}s")
            self.client.pump(min(left, RESTORE_BACKOFF[0]) if lost else left)

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
        approve: Optional[ApprovalHandler] = None,
        on_event: Optional[Callable[[AnyEvent], None]] = None,
        timeout: float = 60.0,
        **fields: Any,
    ) -> Reply:
        """Submits a user turn and drives it to its end: runs every requested tool call through
        `tools` (in order), submits the results, asks `approve` about every server tool call that
        needs approval (True, False or a ToolDecision), submits the decisions, and returns the
        final reply (Final, Failed or Refused)."""
        self.submit_turn(turn_id, instruction, **fields)
        decided: Optional[str] = None  # the message_id of the decisions last sent
        while True:
            reply: Optional[Reply] = None
            for event in self.turn_events(turn_id, timeout):
                if on_event:
                    on_event(event)
                if isinstance(event, Reply):
                    reply = event
            if isinstance(reply, Refused) and decided and reply.correlation_id == decided \
                    and reply.code in p.LATE_DECISION_CODES:
                # Decided too late (the request expired, its calls denied): the turn goes on.
                decided = None
                continue
            if isinstance(reply, ApprovalRequired):
                if approve is None:
                    raise RuntimeError(f"turn {turn_id} asks for approvals and no handler was given")
                decided = self.submit_approvals(turn_id, [_decision(c, approve(c)) for c in reply.calls]).message_id
                continue
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
        """Deletes the reply queue. The broker then cancels this session's consumer, and the
        session's next `next_event` declares and consumes the queue again (the server declares it
        too, at the session's next admitted turn); what it held is gone, and replies the server
        could not deliver meanwhile wait in PostgreSQL for it (§12).

        Not for a session of an instance, which has no queue of its own (RuntimeError): see
        `Instance.delete_queue`."""
        if self._instance is not None:
            raise RuntimeError(f"session {self.session_id} reads the instance queue {self.queue}; "
                               "it has no queue of its own to delete")
        self._ch.queue_delete(self.queue)


def _decision(call: ToolCall, answer: Union[bool, ToolDecision]) -> ToolDecision:
    if isinstance(answer, ToolDecision):
        return answer
    return ToolDecision.approve(call) if answer else ToolDecision.deny(call)


def _maybe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _props(props: Any) -> Dict[str, Any]:
    names = ("type", "message_id", "correlation_id", "reply_to", "user_id", "content_type", "delivery_mode")
    return {n: getattr(props, n) for n in names if getattr(props, n, None) is not None}


def _wire_out(exchange: str, key: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"exchange": exchange, "routing_key": key, "mandatory": True,
            "properties": _props(props), "headers": dict(props.headers or {}), "body": body}


def _wire_in(queue: str, props: Any, body: Any) -> Dict[str, Any]:
    return {"queue": queue, "properties": _props(props), "headers": dict(props.headers or {}),
            "body": body}
