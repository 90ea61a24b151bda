"""Broker clusters without a cluster: the node list, node rotation on connect, reconnecting after
a connection loss, and publishing again after a nack.

The "nodes" are local TCP forwarders to the one service broker (127.0.0.1:5672): `drop()` severs
every connection through one (as a node loss does), `stop()` makes it refuse new ones. A port that
refuses and a listener that never answers stand for dead nodes. Nacks are real: a queue with
`x-overflow: reject-publish` and `x-max-length: 0` bound to the requests exchange nacks every
request routed to it. Everything lives under a random prefix and is deleted afterwards.
"""

import socket
import threading
import time
from types import SimpleNamespace

import pika
import pytest

import aptix_client.client as client_mod
from aptix_client import Client, ConnectionLost, EventTimeout, Final, PublishError, parse_urls, redact_url
from aptix_client.client import Session

BROKER = ("127.0.0.1", 5672)


def url(port):
    return f"amqp://guest:guest@127.0.0.1:{port}/%2f"


class Proxy:
    """A TCP forwarder to the broker, standing for one cluster node."""

    def __init__(self, target=BROKER):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = url(self.port)
        self.conns = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(self.target)
            self.accepted += 1
            self.conns += [down, up]
            threading.Thread(target=self._pipe, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self):
        """Severs every connection through this node, on both sides."""
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.conns = []

    def stop(self):
        """Refuses new connections too."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
        except OSError:
            pass
        self.sock.close()
        self.drop()


def refused_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


@pytest.fixture
def silent():
    """A node that takes the TCP connection and never says a word."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield url(s.getsockname()[1])
    s.close()


@pytest.fixture
def proxies(broker):
    made = [Proxy(), Proxy()]
    yield made
    for p in made:
        p.stop()


# --- the node list --------------------------------------------------------------------------------


def test_urls_one_comma_separated_or_a_list():
    a, b, c = (url(n) for n in (1, 2, 3))
    assert parse_urls(a) == [a]
    assert parse_urls(f"{a}, {b},{c},") == [a, b, c]
    assert parse_urls([a, f"{b},{c}"]) == [a, b, c]
    for empty in ("", " , ", []):
        with pytest.raises(ValueError, match="no broker URL"):
            parse_urls(empty)
    assert redact_url("amqp://u:secret@n1:5672/%2f") == "amqp://u:***@n1:5672/%2f"
    assert redact_url("amqp://n1/%2f") == "amqp://n1/%2f"


def test_connect_starts_at_a_random_node_and_moves_on(monkeypatch):
    tried = []

    class FakeConnection:
        is_open = True

        def __init__(self, params):
            tried.append((params.port, params.socket_timeout, params.stack_timeout,
                          params.client_properties["connection_name"]))
            if params.port != 3:
                raise pika.exceptions.AMQPConnectionError("refused")

    monkeypatch.setattr(client_mod.pika, "BlockingConnection", FakeConnection)
    monkeypatch.setattr(client_mod.random, "randrange", lambda n: 3)
    c = Client(",".join(url(n) for n in (1, 2, 3, 4, 5)), "p", connect_timeout=1.5, connection_name="me")
    assert [t[0] for t in tried] == [4, 5, 1, 2, 3], "from the random start, round the list"
    assert c.node == 2 and c.urls[c.node] == url(3)
    assert {t[1:] for t in tried} == {(1.5, 1.5, "me")}
    tried.clear()
    with pytest.raises(pika.exceptions.AMQPConnectionError, match=r"guest:\*\*\*@127.0.0.1:1/") as e:
        Client([url(1), url(2)], "p")
    assert "guest:guest" not in str(e.value)
    assert [t[0] for t in tried] == [2, 1]  # 3 % 2: from the second
    assert tried[0][3] == "aptix-client p"


def test_a_node_that_refuses_or_is_silent_is_skipped(broker, prefix, silent):
    nodes = [url(refused_port()), silent, broker]
    for _ in range(3):  # from whatever node the random start picks
        t0 = time.monotonic()
        with Client(nodes, prefix, connect_timeout=0.5) as c:
            assert c.node == 2
        assert time.monotonic() - t0 < 3


# --- reconnecting ---------------------------------------------------------------------------------


def test_a_lost_connection_is_taken_again_and_the_session_queue_consumed_again(fake, proxies):
    with Client([p.url for p in proxies], fake.prefix, reconnect_backoff=(0.05, 0.2)) as c:
        s = c.open_session()
        s.submit_turn("t1", "one")
        assert s.next_event(10).turn_id == "t1"  # handed out, acked only at the next call
        s.submit_turn("t2", "two")
        deadline = time.monotonic() + 10
        while not s._inbox:
            assert time.monotonic() < deadline
            c.pump(0.1)
        for p in proxies:
            p.drop()  # the node is lost: t1 and t2 were delivered, not acked
        assert s.next_event(10).turn_id == "t2"  # already taken
        sub = s.submit_turn("t3", "three")  # its confirm is lost with the connection: sent again
        assert sub.attempts >= 1
        e = s.next_event(10)
        assert isinstance(e, Final) and e.turn_id == "t3" and e.text == "echo: three"
        assert c.reconnects == 1
        assert s.duplicates_dropped == 2, "t1 and t2 came again and were dropped by message_id"
    assert sum(p.accepted for p in proxies) == 2


def test_an_instance_queue_is_declared_and_consumed_again(fake, proxies):
    with Client([p.url for p in proxies], fake.prefix, instance="pod-r",
                reconnect_backoff=(0.05, 0.2)) as c:
        s = c.open_session()
        s.submit_turn("t1", "one")
        assert s.next_event(10).turn_id == "t1"
        for p in proxies:
            p.drop()
        with pytest.raises(pika.exceptions.AMQPError):
            c.instance.channel.basic_qos(prefetch_count=10)  # the old channel is dead
        c.pump(0.5)  # notices, reconnects, declares and consumes the instance queue again
        assert c.reconnects == 1 and c.instance.channel.is_open
        s.submit_turn("t2", "two")
        assert s.next_event(10).turn_id == "t2"
        assert s.duplicates_dropped == 1  # t1, not acked before the loss


def test_a_queue_the_broker_refuses_after_a_reconnect_does_not_stop_the_other_sessions(fake, broker, proxies):
    """After a reconnect, one session's queue cannot be declared (as while its node is down:
    here it was declared again with other arguments, so the broker refuses the client's): the
    client's other sessions go on, and the refused one declares its queue once it can."""
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    with Client([p.url for p in proxies], fake.prefix, reconnect_backoff=(0.05, 0.2), reconnect_timeout=5) as c:
        a, b = c.open_session(), c.open_session()
        for p in proxies:
            p.drop()
        ch.queue_delete(a.queue)
        ch.queue_declare(a.queue, durable=True, arguments={"x-max-length": 5})
        b.submit_turn("t1", "for b")  # notices the loss, reconnects: a's declaration is refused (406)
        assert b.next_event(10).turn_id == "t1"
        assert c.reconnects == 1
        ch.queue_delete(a.queue)
        with pytest.raises(EventTimeout):
            a.next_event(1)  # declares and consumes its queue again, with back-off
        assert a.restores == 1
        a.submit_turn("t2", "for a")
        e = a.next_event(10)
        assert isinstance(e, Final) and e.turn_id == "t2", e
    admin.close()


def delete_queue(broker, queue):
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    admin.channel().queue_delete(queue)
    admin.close()


def test_no_node_left_is_connection_lost(broker, prefix, proxies):
    one = proxies[0]
    c = Client(one.url, prefix, reconnect_backoff=(0.05, 0.1), reconnect_timeout=0.5)
    s = c.open_session()
    try:
        one.stop()
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost, match="no broker node took a new one"):
            s.next_event(5)
        assert time.monotonic() - t0 < 3
    finally:
        delete_queue(broker, s.queue)


def test_without_reconnect_the_loss_is_raised(broker, prefix, proxies):
    c = Client(proxies[0].url, prefix, reconnect=False)
    s = c.open_session()
    try:
        proxies[0].drop()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            s.next_event(5)
    finally:
        delete_queue(broker, s.queue)


# --- publishing again -----------------------------------------------------------------------------


def test_a_nacked_request_is_sent_again_on_a_fresh_channel(fake, broker, monkeypatch):
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    full = f"{fake.prefix}.full"
    ch.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.queue_bind(full, f"{fake.prefix}.requests", "#")
    waits = []

    def sleep(seconds):  # the pause before the second attempt: the node recovers
        waits.append(seconds)
        ch.queue_delete(full)

    monkeypatch.setattr(client_mod, "_sleep", sleep)
    try:
        with Client(broker, fake.prefix) as c:
            s = c.open_session()
            first = s._ch
            sub = s.submit_turn("t1", "nacked once")
            assert sub.attempts == 2 and waits == [client_mod.PUBLISH_BACKOFF[0]]
            assert s._ch is not first and not first.is_open, "the channel that nacked is not reused"
            assert s.next_event(10).turn_id == "t1"
        ids = {props.message_id for props, _, _ in fake.requests}
        assert ids == {sub.message_id}, "every copy has the same message_id"
    finally:
        ch.queue_delete(full)
        admin.close()


def test_a_request_nacked_every_time_is_a_publish_error(fake, broker, monkeypatch):
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    full = f"{fake.prefix}.full"
    ch.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.queue_bind(full, f"{fake.prefix}.requests", "#")
    monkeypatch.setattr(client_mod, "_sleep", lambda s: None)
    try:
        with Client(broker, fake.prefix, publish_attempts=3) as c:
            s = c.open_session()
            with pytest.raises(PublishError, match=r"nacked request .* \(gave up after 3 attempts\)"):
                s.submit_turn("t1", "never")
    finally:
        ch.queue_delete(full)
        admin.close()


class NackingChannel:
    """A pika channel that nacks the first `nacks` publishes it sees."""

    def __init__(self, log, nacks):
        self.log, self.nacks, self.is_open = log, nacks, True

    def confirm_delivery(self):
        pass

    def queue_declare(self, queue, durable=False, arguments=None):
        self.log.append(("declare", queue))

    def add_on_cancel_callback(self, callback):
        pass

    def basic_consume(self, queue, callback, auto_ack=False):
        self.log.append(("consume", queue))
        return "ctag"

    def basic_publish(self, exchange, key, body, props, mandatory=False):
        self.log.append(("publish", props.message_id, body))
        if self.log.count("nack") < self.nacks:
            self.log.append("nack")
            raise pika.exceptions.NackError([])

    def close(self):
        self.is_open = False


def test_resend_keeps_message_id_and_body(monkeypatch):
    monkeypatch.setattr(client_mod, "_sleep", lambda s: None)
    log = []
    conn = SimpleNamespace(is_open=True, channel=lambda: NackingChannel(log, 2))
    client = SimpleNamespace(prefix="u", strict=True, schemas=None, wire_log=None, _conn=conn, _sessions=[],
                             publish_attempts=6)
    s = Session(client, "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f")
    sub = s.submit_turn("t1", "x", message_id="m-1")
    publishes = [e for e in log if e[0] == "publish"]
    assert sub.attempts == 3 and len(publishes) == 3 and len(set(publishes)) == 1
    assert publishes[0][1] == "m-1"
    consumed = [e[0] for e in log if e != "nack"].count("consume")
    assert consumed == 3, "each nack: a fresh channel, declared and consumed again"
