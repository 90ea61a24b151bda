"""Resuming a turn's stream, written from docs/client-protocol.md §4 and §9a alone (raw pika, not
the official client): a backend reads a few deltas, loses its process and its queue, declares the
queue again, publishes `turn.resume` with the last `x-aptix-event-seq` it handled, holds the
turn's events until the `resumed` notice, and then handles every event exactly once, in order."""

from __future__ import annotations

import json
import time
import uuid

import pika

from conftest import sim_control

WAIT = 90.0


class Backend:
    """One backend process: §4 steps 1-3 for one session, and its reads."""

    def __init__(self, pipeline, session: str):
        self.pipeline, self.session = pipeline, session
        self.conn = pika.BlockingConnection(pika.URLParameters(pipeline.amqp_url))
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        self.queue = f"{pipeline.prefix}.session.{session}"
        self.ch.queue_declare(self.queue, durable=True, exclusive=False, auto_delete=False, arguments={})

    def publish(self, body: dict, kind: str | None = None) -> None:
        props = pika.BasicProperties(delivery_mode=2, content_type="application/json",
                                     message_id=str(uuid.uuid4()), type=kind)
        self.ch.basic_publish(f"{self.pipeline.prefix}.requests", self.session,
                              json.dumps(body).encode(), props, mandatory=True)

    def read(self, until, timeout: float = WAIT) -> list:
        """Messages as (type, message_id, headers, body), acknowledged, until `until(got)`."""
        got: list = []
        deadline = time.monotonic() + timeout
        for method, props, body in self.ch.consume(self.queue, auto_ack=False, inactivity_timeout=1.0):
            if method is not None:
                self.ch.basic_ack(method.delivery_tag)
                got.append((props.type, props.message_id, props.headers or {}, json.loads(body)))
            if until(got) or time.monotonic() > deadline:
                break
        self.ch.cancel()
        return got

    def close(self) -> None:
        self.conn.close()


def test_a_backend_resumes_a_stream_it_lost(pipeline):
    sim_control(pipeline, {"command": "set_latency", "latency": {"per_event_ms": 40}})
    try:
        session = str(uuid.uuid4())
        first = Backend(pipeline, session)
        long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail " * 12
        first.publish({"SessionId": session, "TurnId": "t1", "Instruction": long, "Stream": True})
        seen = first.read(lambda got: len(got) >= 3)
        assert [m[0] for m in seen] == ["delta"] * 3, seen
        last = seen[-1][2]["x-aptix-event-seq"]
        # The process dies, its queue with it; what is published meanwhile is lost.
        first.ch.queue_delete(first.queue)
        first.close()
        time.sleep(0.6)

        second = Backend(pipeline, session)
        second.publish({"SessionId": session, "TurnId": "t1", "AfterSeq": last}, kind="turn.resume")
        got = second.read(lambda got: any(m[0] == "resumed" for m in got)
                          and any(m[0] == "reply" and m[2].get("x-aptix-final") for m in got))
        notice = next(m for m in got if m[0] == "resumed")
        assert notice[3]["AfterSeq"] == last and notice[3]["Resumed"] is True, notice
        # Held until the notice, then in event-sequence order, each message id once.
        handled, ids = [], {m[1] for m in seen}
        for kind, message_id, headers, body in sorted((m for m in got if m[0] != "resumed"),
                                                      key=lambda m: m[2]["x-aptix-event-seq"]):
            if message_id in ids or headers["x-aptix-event-seq"] <= last:
                continue
            ids.add(message_id)
            handled.append((kind, headers["x-aptix-event-seq"], body))
        numbers = [n for _, n, _ in handled]
        deltas = [n for k, n, _ in handled if k == "delta"]
        assert deltas == list(range(last + 1, last + 1 + len(deltas))), numbers
        assert handled[-1][0] == "reply" and handled[-1][1] == 999_999, handled[-1]
        text = "".join(b["Event"].get("Text", "") for k, _, b in handled if k == "delta"
                       and b["Event"]["Type"] == "OutputText")
        earlier = "".join(m[3]["Event"].get("Text", "") for m in seen if m[3]["Event"]["Type"] == "OutputText")
        assert earlier + text == handled[-1][2]["Result"]["PrimaryOutputText"]
        second.close()
    finally:
        sim_control(pipeline, {"command": "set_latency", "latency": {}})


def test_a_resume_of_an_unknown_turn_is_refused(pipeline):
    session = str(uuid.uuid4())
    b = Backend(pipeline, session)
    b.publish({"SessionId": session, "TurnId": "nope"}, kind="turn.resume")
    got = b.read(lambda got: len(got) >= 1, timeout=30)
    assert got and got[0][0] == "reply", got
    assert got[0][3]["Errors"][0]["Code"] == "turn.not_found", got
    assert f":nope:rejected-resume-" in got[0][1], got
    b.close()


def test_the_official_client_resumes_a_stream_after_a_reconnect(pipeline, schemas):
    """The official client, its connection lost mid-stream and its queue deleted meanwhile:
    after reconnecting it resumes the turn by itself, and the application reads every delta
    once, in order, then the reply."""
    from aptix_client import Client, Delta, Final

    sim_control(pipeline, {"command": "set_latency", "latency": {"per_event_ms": 40}})
    try:
        with Client(pipeline.amqp_url, pipeline.prefix, schemas=schemas, strict=True) as client:
            s = client.open_session()
            long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail " * 12
            s.submit_turn("t1", long, stream=True)
            got = [s.next_event(WAIT, "t1") for _ in range(3)]
            assert all(isinstance(e, Delta) for e in got), got
            # The connection goes, and the queue with what it held; the stream goes on.
            admin = pika.BlockingConnection(pika.URLParameters(pipeline.amqp_url))
            admin.channel().queue_delete(s.queue)
            admin.close()
            client._conn.close()
            time.sleep(0.6)
            rest = list(s.turn_events("t1", WAIT))
            assert isinstance(rest[-1], Final), rest[-1]
            assert s.resumes == 1
            deltas = [e for e in got + rest[:-1]]
            numbers = [e.headers["x-aptix-event-seq"] for e in deltas]
            assert numbers == list(range(len(numbers))), numbers
            text = "".join(e.event.get("Text", "") for e in deltas if e.event.get("Type") == "OutputText")
            assert text == rest[-1].text
    finally:
        sim_control(pipeline, {"command": "set_latency", "latency": {}})
