"""Replies per instance (protocol §4a) without a broker: the client's `Instance` and its sessions
over a scripted fake of pika's channel, checking what is declared, consumed, published and acked,
and how the messages of one queue are handed to many sessions. Then tenants, the same way: the
`user_id` of every request, the tenant's queue names, and the checks made before connecting.
"""

import json
from collections import deque
from types import SimpleNamespace

import pika
import pytest

from aptix_client import Client, Final, Instance, ProtocolError, Refused, ToolResult, shared_user, url_user
import aptix_client.client as client_mod
from aptix_client.client import Session

PREFIX = "unit"
QUEUE = f"{PREFIX}.instance.pod-1"
A = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f"
B = "0b4d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"
C = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"


class FakeChannel:
    def __init__(self, conn):
        self.conn = conn
        self.is_open = True
        self.confirms = False
        self.declared = []
        self.consumers = []
        self.published = []
        self.acked = []
        self.deleted = []

    def confirm_delivery(self):
        self.confirms = True

    def queue_declare(self, queue, passive=False, durable=False, exclusive=False, auto_delete=False,
                      arguments=None):
        self.declared.append(dict(queue=queue, passive=passive, durable=durable, exclusive=exclusive,
                                  auto_delete=auto_delete, arguments=arguments))

    def add_on_cancel_callback(self, callback):
        self.on_cancel = callback

    def basic_consume(self, queue, callback, auto_ack=False):
        self.consumers.append((queue, callback, auto_ack))
        return "ctag"

    def basic_publish(self, exchange, routing_key, body, properties, mandatory=False):
        self.published.append(SimpleNamespace(exchange=exchange, routing_key=routing_key,
                                              body=json.loads(body), props=properties, mandatory=mandatory))

    def basic_ack(self, tag):
        self.acked.append(tag)

    def queue_delete(self, queue):
        self.deleted.append(queue)

    def close(self):
        self.is_open = False


class FakeConnection:
    """Hands the messages `arrive` queued to the consumer when the client pumps."""

    def __init__(self):
        self.channels = []
        self.queued = deque()
        self.tag = 0

    def channel(self):
        ch = FakeChannel(self)
        self.channels.append(ch)
        return ch

    def arrive(self, headers, body, message_id, kind="reply"):
        self.tag += 1
        props = pika.BasicProperties(type=kind, message_id=message_id, headers=headers,
                                     content_type="application/json", delivery_mode=2)
        self.queued.append((SimpleNamespace(delivery_tag=self.tag), props, json.dumps(body).encode()))
        return self.tag

    def deliver_all(self):
        (_, callback, _), = [c for ch in self.channels for c in ch.consumers]
        ch = self.channels[0]
        while self.queued:
            method, props, body = self.queued.popleft()
            callback(ch, method, props, body)


class FakeClient:
    """What a Session and an Instance use of a Client."""

    def __init__(self, tenant=None, user_id=None):
        self.prefix = PREFIX
        self.tenant = tenant
        self.user_id = user_id
        self.strict = True
        self.schemas = None
        self.wire_log = None
        self._conn = FakeConnection()
        self._sessions = []

    def pump(self, time_limit):
        self._conn.deliver_all()


def final(conn, sid, turn, step=0, text=None):
    headers = {"x-aptix-session-id": sid, "x-aptix-turn-id": turn, "x-aptix-kind": "reply",
               "x-aptix-final": True, "x-aptix-step": step, "x-aptix-outcome": "final"}
    body = {"Successful": True, "Errors": [], "Warnings": [], "Result": {
        "SessionId": sid, "TurnId": turn, "ModeDisplayName": "General", "Kind": "final",
        "PrimaryOutputText": text or f"{sid[:4]} {turn}"}}
    return conn.arrive(headers, body, f"reply:{sid}:{turn}:step-{step}")


@pytest.fixture
def setup():
    client = FakeClient()
    inst = Instance(client, "pod-1")
    return client, inst, client._conn.channels[0]


def open_session(client, inst, sid):
    s = inst._open(sid)
    client._sessions.append(s)
    return s


def test_the_instance_queue_is_declared_once_and_consumed_with_manual_acks(setup):
    client, inst, ch = setup
    assert inst.queue == QUEUE and ch.confirms
    assert ch.declared == [dict(queue=QUEUE, passive=False, durable=True, exclusive=False,
                                auto_delete=False, arguments={})]
    assert [(q, ack) for q, _, ack in ch.consumers] == [(QUEUE, False)]
    for sid in (A, B, C):
        s = open_session(client, inst, sid)
        assert s.queue == QUEUE and s.reply_to == QUEUE and s.instance is inst
    assert len(client._conn.channels) == 1, "sessions of an instance open no channel"
    assert len(ch.declared) == 1 and len(ch.consumers) == 1, "and declare or consume nothing"


def test_every_request_carries_reply_to(setup):
    client, inst, ch = setup
    s = open_session(client, inst, A)
    sub = s.submit_turn("t1", "hello")
    s._pending_calls["t1"] = ["c1"]
    tools = s.submit_tool_results("t1", [ToolResult.ok("c1", {"x": 1})])
    raw = s.submit({"SessionId": A, "TurnId": "t2", "Instruction": "x"}, reply_to="amq.rabbitmq.reply-to")
    assert [m.props.reply_to for m in ch.published] == [QUEUE, QUEUE, "amq.rabbitmq.reply-to"]
    assert (sub.reply_to, tools.reply_to, raw.reply_to) == (QUEUE, QUEUE, "amq.rabbitmq.reply-to")
    for m in ch.published:
        assert (m.exchange, m.routing_key, m.mandatory) == (f"{PREFIX}.requests", A, True)
        assert (m.props.delivery_mode, m.props.content_type) == (2, "application/json")
    assert ch.published[1].body["ToolResults"][0]["ToolCallId"] == "c1"


def test_messages_go_to_their_session_in_order(setup):
    client, inst, ch = setup
    a, b = open_session(client, inst, A), open_session(client, inst, B)
    final(client._conn, A, "t0")
    final(client._conn, B, "t0")
    final(client._conn, A, "t1")
    final(client._conn, B, "t1")
    assert [b.next_event(1).turn_id, b.next_event(1).turn_id] == ["t0", "t1"]
    first = a.next_event(1)
    assert isinstance(first, Final) and first.session_id == A and first.text == f"{A[:4]} t0"
    assert a.next_event(1, turn_id="t1").turn_id == "t1"
    assert ch.acked == [2, 1], "acked once handled: b's first when b asked again, a's first likewise"
    a.close()
    b.close()
    assert sorted(ch.acked) == [1, 2, 3, 4]
    assert ch.is_open, "closing a session leaves the instance's channel open"


def test_messages_of_a_session_not_open_wait_for_it(setup):
    client, inst, ch = setup
    final(client._conn, C, "t0")
    final(client._conn, C, "t1")
    client.pump(0)
    assert inst.pending_sessions() == [C] and ch.acked == []
    c = open_session(client, inst, C)
    assert inst.pending_sessions() == []
    assert [c.next_event(1).turn_id, c.next_event(1).turn_id] == ["t0", "t1"]


def test_copies_are_dropped_by_message_id_even_after_close(setup):
    client, inst, ch = setup
    a = open_session(client, inst, A)
    final(client._conn, A, "t0")
    final(client._conn, A, "t0")
    assert a.next_event(1).turn_id == "t0"
    assert a.duplicates_dropped == 1 and ch.acked == [2]
    a.close()
    late = final(client._conn, A, "t0")
    client.pump(0)
    assert inst.duplicates_dropped == 1 and late in ch.acked and inst.pending_sessions() == []


def test_the_ids_remembered_are_bounded(setup, monkeypatch):
    """A session remembers the newest ids only, and an instance the ids of its newest closed
    sessions only: a backend that lives for months does not keep every id it ever saw."""
    ids = client_mod.SeenIds(bound=3)
    for mid in "abcd":
        ids.add(mid)
    assert "a" not in ids and list(ids) == ["b", "c", "d"]
    ids.add("b")  # seen again: now the newest
    ids.add("e")
    assert list(ids) == ["d", "b", "e"]
    monkeypatch.setattr(client_mod, "SEEN_CLOSED_SESSIONS", 1)
    client, inst, _ = setup
    for sid in (B, A, B):  # B opened first, but closed last
        open_session(client, inst, sid).close()
    still = open_session(client, inst, C)
    assert set(inst._seen) == {B, C}, "the ids of the session closed longest ago are forgotten"
    assert still.seen is inst._seen[C]


def test_unread_messages_go_back_to_the_session_when_it_is_reopened(setup):
    client, inst, ch = setup
    a = open_session(client, inst, A)
    first, second = final(client._conn, A, "t0"), final(client._conn, A, "t1")
    assert a.next_event(1).turn_id == "t0"
    a.close()
    assert ch.acked == [first] and inst.pending_sessions() == [A]
    again = open_session(client, inst, A)
    with pytest.raises(ValueError, match="already open"):
        open_session(client, inst, A)
    event = again.next_event(1)
    assert event.turn_id == "t1" and again.duplicates_dropped == 0
    again.close()
    assert ch.acked == [first, second]


def test_a_message_naming_no_session_is_acked_and_reported(setup):
    client, inst, ch = setup
    tag = client._conn.arrive({"x-aptix-kind": "reply"}, {"Successful": False, "Result": None}, "odd")
    client.pump(0)
    assert ch.acked == [tag]
    assert len(inst.unroutable) == 1 and isinstance(inst.unroutable[0], ProtocolError)


def test_a_refusal_goes_to_its_session_by_header(setup):
    client, inst, ch = setup
    a = open_session(client, inst, A)
    client._conn.arrive({"x-aptix-session-id": A, "x-aptix-turn-id": "t1", "x-aptix-kind": "reply",
                         "x-aptix-final": True, "x-aptix-outcome": "refused"},
                        {"Successful": False, "Result": None, "Warnings": [],
                         "Errors": [{"Code": "request.reply_to_invalid", "Message": "no"}]},
                        f"reply:{A}:t1:rejected-0123456789abcdef01234567")
    reply = a.next_event(1)
    assert isinstance(reply, Refused) and reply.code == "request.reply_to_invalid"


def test_an_instance_session_has_no_queue_to_delete(setup):
    client, inst, ch = setup
    a = open_session(client, inst, A)
    with pytest.raises(RuntimeError, match="no queue of its own"):
        a.delete_queue()
    inst.delete_queue()
    assert ch.deleted == [QUEUE]


def test_a_bad_instance_name_is_refused_before_connecting():
    for bad in ["", "a b", "x" * 65, "pod/1"]:
        with pytest.raises(ValueError, match="instance name"):
            Client("amqp://nobody:nothing@127.0.0.1:1/%2f", "p", instance=bad)


def test_per_session_sessions_send_no_reply_to():
    client = FakeClient()
    s = Session(client, A)
    assert s.reply_to is None and s.instance is None and s.queue == f"{PREFIX}.session.{A}"
    s.submit_turn("t1", "x")
    ch = client._conn.channels[0]
    assert ch.published[0].props.reply_to is None
    assert ch.declared[0]["queue"] == s.queue


# --- tenants -------------------------------------------------------------------------------------


def test_the_user_of_a_url():
    assert url_user("amqp://guest:guest@127.0.0.1:5672/%2f") == "guest"
    assert url_user("amqp://aptix-tenant-a:pw@n1/%2f") == "aptix-tenant-a"
    assert url_user("amqp://a%40b%3Ac:p%40ss@n1/%2f") == "a@b:c", "percent-decoded"
    assert url_user("amqp://n1:5672/%2f") == "guest", "pika's default without credentials"
    assert shared_user(["amqp://u:p@n1/%2f", "amqp://u:q@n2/%2f"]) == "u"
    with pytest.raises(ValueError, match="different users"):
        shared_user(["amqp://u:p@n1/%2f", "amqp://v:p@n2/%2f"])


def test_bad_tenant_names_and_mixed_users_are_refused_before_connecting():
    for bad in ["", "T1", "a.b", "-a", "x" * 33, "t 1"]:
        with pytest.raises(ValueError, match="tenant name"):
            Client("amqp://nobody:nothing@127.0.0.1:1/%2f", "p", tenant=bad)
    with pytest.raises(ValueError, match="different users"):
        Client("amqp://a:x@127.0.0.1:1/%2f,amqp://b:x@127.0.0.1:2/%2f", "p")


def test_every_request_carries_user_id():
    client = FakeClient(user_id="aptix-client-1")
    s = Session(client, A)
    s.submit_turn("t1", "x")
    s._pending_calls["t1"] = ["c1"]
    s.submit_tool_results("t1", [ToolResult.ok("c1", 1)])
    s.submit(b'{"SessionId": "raw bytes"}', validate=False, reply_to="elsewhere")
    ch = client._conn.channels[0]
    assert [m.props.user_id for m in ch.published] == ["aptix-client-1"] * 3


def test_a_tenants_session_queue_carries_its_name():
    client = FakeClient(tenant="t1", user_id="tenant-user")
    s = Session(client, A)
    assert s.queue == f"{PREFIX}.session.t1.{A}" and s.reply_to is None
    s.submit_turn("t1", "x")
    ch = client._conn.channels[0]
    assert ch.declared == [dict(queue=s.queue, passive=False, durable=True, exclusive=False,
                                auto_delete=False, arguments={})]
    assert [(q, ack) for q, _, ack in ch.consumers] == [(s.queue, False)]
    assert ch.published[0].props.reply_to is None and ch.published[0].props.user_id == "tenant-user"


def test_a_tenants_instance_queue_carries_its_name_and_is_the_reply_to():
    client = FakeClient(tenant="acme", user_id="acme-backend")
    inst = Instance(client, "pod-1")
    queue = f"{PREFIX}.instance.acme.pod-1"
    ch = client._conn.channels[0]
    assert inst.queue == queue and [d["queue"] for d in ch.declared] == [queue]
    s = open_session(client, inst, A)
    sub = s.submit_turn("t1", "hello")
    assert s.queue == s.reply_to == sub.reply_to == queue
    assert (ch.published[0].props.reply_to, ch.published[0].props.user_id) == (queue, "acme-backend")
