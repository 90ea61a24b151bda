"""The client's AMQP side against the real RabbitMQ, with a small fake server in a thread playing
the pipeline's part of protocol v3 (entry exchange, ingress queue, replies exchange, typed headers).

The fake answers each request with a final reply; `@stream` adds three deltas first, `@dup`
publishes the reply twice under one message_id, `@badheader` sends `x-aptix-final` as a string,
`@hold` sends nothing until `finish(turn)`, `@refuse` refuses the submission (`turn.conflict`,
the turn going on), `@busy` refuses it with `session.busy` (nothing stored). A `turn.resume` is answered with a `resumed` notice, or refused
(`turn.not_found`) while `refuse_resumes` is set.
A request whose `reply_to` names an instance queue (§4a) is answered there, through the replies
exchange with routing key `instance.<I>`, and the fake then declares no session queue. Tenants:
`fake.tenants` maps a request's `user_id` (as the broker checked it) to a tenant `T`, whose
session replies go to `<prefix>.session.T.<SessionId>`.
"""

import json
import threading
import time
import uuid

import pika
import pytest

from aptix_client import (Client, Delta, Final, ProtocolError, PublishError, Refused, ToolResult,
                          session_queue, url_user)
from conftest import queue_exists, wait_for

S2 = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f"


class FakeServer(threading.Thread):
    def __init__(self, url, prefix):
        super().__init__(daemon=True)
        self.prefix = prefix
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = self.conn.channel()
        ch.exchange_declare(f"{prefix}.requests", "topic", durable=True)
        ch.queue_declare(f"{prefix}.requests", durable=True)
        ch.queue_bind(f"{prefix}.requests", f"{prefix}.requests", "#")
        ch.exchange_declare(f"{prefix}.replies", "direct", durable=True)
        ch.basic_consume(f"{prefix}.requests", self.on_request)
        self.ch = ch
        self.requests = []
        #: user_id -> tenant, for replies to a tenant's session queue.
        self.tenants = {}
        self.queues = set()
        #: Answer a turn.resume with a refusal (turn.not_found) instead of a notice.
        self.refuse_resumes = False
        #: Turns sent with @hold: TurnId -> (routing key, SessionId).
        self.held = {}

    def run(self):
        self.ch.start_consuming()

    def stop(self):
        self.conn.add_callback_threadsafe(self.ch.stop_consuming)
        self.join(5)
        instances = {r[0].reply_to for r in self.requests if r[0].reply_to}
        for q in [f"{self.prefix}.requests", *self.queues, *instances]:
            self.ch.queue_delete(q)
        for x in ("requests", "replies"):
            self.ch.exchange_delete(f"{self.prefix}.{x}")
        self.conn.close()

    def publish(self, key, mid, kind, headers, body):
        props = pika.BasicProperties(type=kind, message_id=mid, content_type="application/json",
                                     delivery_mode=2, headers=headers)
        self.ch.basic_publish(f"{self.prefix}.replies", key, json.dumps(body).encode(), props,
                              mandatory=True)

    def refusal(self, key, s, t, tag, code, correlation_id):
        headers = {"x-aptix-session-id": s, "x-aptix-turn-id": t, "x-aptix-kind": "reply",
                   "x-aptix-final": True, "x-aptix-outcome": "refused"}
        body = {"Successful": False, "Result": None, "Warnings": [], "SessionId": s, "TurnId": t,
                "Errors": [{"Code": code, "Message": f"refused by the fake: {code}"}]}
        props = pika.BasicProperties(type="reply", message_id=f"reply:{s}:{t}:{tag}-{uuid.uuid4().hex[:24]}",
                                     correlation_id=correlation_id, content_type="application/json",
                                     delivery_mode=2, headers=headers)
        self.ch.basic_publish(f"{self.prefix}.replies", key, json.dumps(body).encode(), props, mandatory=True)

    def finish(self, turn):
        """Answers a turn sent with @hold, from the fake's own thread."""
        wait_for(lambda: turn in self.held)
        key, s = self.held.pop(turn)
        self.conn.add_callback_threadsafe(lambda: self.final(key, s, turn, f"echo: finished {turn}"))

    def final(self, key, s, t, text):
        headers = {"x-aptix-session-id": s, "x-aptix-turn-id": t, "x-aptix-kind": "reply",
                   "x-aptix-final": True, "x-aptix-step": 0, "x-aptix-outcome": "final"}
        body = {"Successful": True, "Errors": [], "Warnings": [], "Result": {
            "SessionId": s, "TurnId": t, "ModeDisplayName": "General", "Kind": "final", "PrimaryOutputText": text}}
        self.publish(key, f"reply:{s}:{t}:step-0", "reply", headers, body)

    def on_resume(self, ch, props, req, key):
        s, t = req["SessionId"], req["TurnId"]
        if self.refuse_resumes:
            self.refusal(key, s, t, "rejected-resume", "turn.not_found", props.message_id)
        else:
            notice = {"Resumed": True, "SessionId": s, "TurnId": t, "AfterSeq": req.get("AfterSeq"),
                      "UpToSeq": None, "Ended": False}
            p = pika.BasicProperties(type="resumed", message_id=f"resumed:{s}:{t}:resumed-{uuid.uuid4().hex[:24]}",
                                     correlation_id=props.message_id, content_type="application/json",
                                     delivery_mode=2, headers={"x-aptix-session-id": s, "x-aptix-turn-id": t})
            self.ch.basic_publish(f"{self.prefix}.replies", key, json.dumps(notice).encode(), p, mandatory=True)

    def on_request(self, ch, method, props, raw):
        req = json.loads(raw)
        self.requests.append((props, req, method.routing_key))
        s, t, text = req["SessionId"], req["TurnId"], req.get("Instruction", "")
        instance_prefix = f"{self.prefix}.instance."
        if props.reply_to and props.reply_to.startswith(instance_prefix):
            # The server only binds an instance queue (the client declared it).
            key = "instance." + props.reply_to[len(instance_prefix):]
            ch.queue_bind(props.reply_to, f"{self.prefix}.replies", key)
        else:
            tenant = self.tenants.get(props.user_id)
            q = session_queue(self.prefix, s, tenant)
            key = f"{tenant}.{s}" if tenant else s  # as the server binds them
            ch.queue_declare(q, durable=True, arguments={})
            ch.queue_bind(q, f"{self.prefix}.replies", key)
            self.queues.add(q)
        common = {"x-aptix-session-id": s, "x-aptix-turn-id": t}
        if props.type == "turn.resume":
            self.on_resume(ch, props, req, key)
            ch.basic_ack(method.delivery_tag)
            return
        if "@busy" in text or "@attached" in text:
            # @attached: the request was a copy of a running turn's, refused as an attach past the
            # resume limit (the turn goes on).
            code = "session.busy" if "@busy" in text else "limit.resumes_per_minute"
            self.refusal(key, s, t, "rejected-busy" if "@busy" in text else "rejected-resume", code,
                         props.message_id)
            ch.basic_ack(method.delivery_tag)
            return
        if "@hold" in text or "@refuse" in text:
            self.held[t] = (key, s)
            if "@refuse" in text:
                self.refusal(key, s, t, "conflict", "turn.conflict", props.message_id)
            ch.basic_ack(method.delivery_tag)
            return
        answer = ""
        if "@stream" in text:
            for seq, piece in enumerate(["a", "b", "c"]):
                answer += piece
                self.publish(key, f"delta:{s}:{t}:0:{seq}", "delta",
                             dict(common, **{"x-aptix-kind": "delta", "x-aptix-step": 0, "x-aptix-seq": seq}),
                             {"Delta": True, "SessionId": s, "TurnId": t, "Step": 0, "Seq": seq,
                              "Event": {"Type": "OutputText", "OutputIndex": 0, "Text": piece}})
        final = "true" if "@badheader" in text else True
        headers = dict(common, **{"x-aptix-kind": "reply", "x-aptix-final": final, "x-aptix-step": 0,
                                  "x-aptix-outcome": "final"})
        body = {"Successful": True, "Errors": [], "Warnings": [], "Result": {
            "SessionId": s, "TurnId": t, "ModeDisplayName": "General", "Kind": "final",
            "PrimaryOutputText": answer or f"echo: {text}"}}
        for _ in range(2 if "@dup" in text else 1):
            self.publish(key, f"reply:{s}:{t}:step-0", "reply", headers, body)
        ch.basic_ack(method.delivery_tag)


def test_a_turn_on_the_wire(fake, broker, schemas):
    wire = []
    with Client(broker, fake.prefix, schemas=schemas, wire_log=lambda d, m: wire.append((d, m))) as c:
        s = c.open_session()
        sub = s.submit_turn("t1", "hello")
        reply = s.next_event(10)
    assert isinstance(reply, Final) and reply.text == "echo: hello"
    props, req, key = fake.requests[0]
    assert key == s.session_id
    assert (props.delivery_mode, props.content_type) == (2, "application/json")
    assert props.message_id == sub.message_id
    assert props.user_id == url_user(broker) == c.user_id, "user_id: the URL's user, as the broker checked it"
    assert req == {"SessionId": s.session_id, "TurnId": "t1", "Instruction": "hello"}
    assert [d for d, _ in wire] == ["out", "in"]
    assert wire[0][1]["exchange"] == f"{fake.prefix}.requests" and wire[0][1]["mandatory"]
    assert wire[0][1]["properties"]["user_id"] == c.user_id
    assert wire[1][1]["headers"]["x-aptix-final"] is True


def test_fresh_message_ids_and_traceparent(fake, broker):
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        a = s.submit_turn("t1", "one", traceparent=tp)
        b = s.submit_turn("t2", "two")
        s.next_event(10), s.next_event(10)
    assert a.message_id != b.message_id
    assert fake.requests[0][0].headers == {"traceparent": tp}


def test_deltas_in_order_then_final(fake, broker, schemas):
    with Client(broker, fake.prefix, schemas=schemas) as c:
        s = c.open_session()
        s.submit_turn("t1", "@stream", stream=True)
        events = list(s.turn_events("t1", 10))
    deltas = [e for e in events if isinstance(e, Delta)]
    assert [d.seq for d in deltas] == [0, 1, 2]
    assert isinstance(events[-1], Final) and "".join(d.text for d in deltas) == events[-1].text


def test_duplicates_are_dropped_by_message_id(fake, broker):
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@dup")
        s.submit_turn("t2", "after")
        assert s.next_event(10).turn_id == "t1"
        assert s.next_event(10).turn_id == "t2"
        assert s.duplicates_dropped == 1


def test_events_of_one_turn_can_be_read_first(fake, broker):
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "first")
        s.submit_turn("t2", "second")
        assert s.next_event(10, turn_id="t2").turn_id == "t2"
        assert s.next_event(10).turn_id == "t1"


def test_mistyped_headers_raise(fake, broker):
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@badheader")
        with pytest.raises(ProtocolError, match="x-aptix-final"):
            s.next_event(10)


def test_an_unroutable_request_is_an_error(broker, prefix):
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    ch.exchange_declare(f"{prefix}.requests", "topic", durable=True)  # nothing bound behind it
    try:
        with Client(broker, prefix) as c:
            s = c.open_session(S2)
            with pytest.raises(PublishError, match="unroutable"):
                s.submit_turn("t1", "lost")
            s.delete_queue()
    finally:
        ch.exchange_delete(f"{prefix}.requests")
        admin.close()


def test_the_reply_queue_is_durable_with_no_arguments(fake, broker):
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
    # Re-declaring it as the server does (durable, no arguments) must not close the channel.
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    ok = ch.queue_declare(s.queue, durable=True, arguments={})
    assert ok.method.queue == s.queue
    ch.queue_delete(s.queue)
    admin.close()


def test_tool_results_go_in_the_order_of_the_calls(fake, broker):
    from aptix_client import ToolResult
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        # As if the session had received a ToolCalls for t1 asking for c1 then c2.
        s._pending_calls["t1"] = ["c1", "c2"]
        with pytest.raises(ValueError, match="waits for results"):
            s.submit_tool_results("t1", [ToolResult.ok("c1", 1)])
        sub = s.submit_tool_results("t1", [ToolResult.ok("c2", 2), ToolResult.ok("c1", 1)])
        assert [r["ToolCallId"] for r in sub.body["ToolResults"]] == ["c1", "c2"]
        s.next_event(10)


def test_a_cancel_on_the_wire(fake, broker, schemas):
    """§7a: the cancel goes where requests go, with `type` = `turn.cancel` and the body
    `{"SessionId", "TurnId"}`, which is no AGN-034 request: the request schema is not applied."""
    from aptix_client import CANCEL_TYPE
    wire = []
    with Client(broker, fake.prefix, schemas=schemas, wire_log=lambda d, m: wire.append((d, m))) as c:
        s = c.open_session()
        turn = s.submit_turn("t1", "hello")
        sub = s.cancel_turn("t1", message_id="cancel-1")
        s.next_event(10)  # the fake answers both with reply:S:t1:step-0: the second is a copy
    for _ in range(100):  # the fake takes the cancel in its own thread
        if len(fake.requests) == 2:
            break
        time.sleep(0.05)
    assert (sub.message_id, sub.turn_id, sub.kind) == ("cancel-1", "t1", CANCEL_TYPE)
    assert sub.body == {"SessionId": s.session_id, "TurnId": "t1"} and turn.kind is None
    (tprops, _, _), (props, req, key) = fake.requests
    assert tprops.type is None, "a request carries no type"
    assert props.type == "turn.cancel" and key == s.session_id
    assert req == {"SessionId": s.session_id, "TurnId": "t1"}
    assert (props.delivery_mode, props.content_type, props.message_id) == (2, "application/json", "cancel-1")
    assert props.user_id == c.user_id
    assert wire[1][0] == "out" and wire[1][1]["properties"]["type"] == "turn.cancel"


# --- replies per instance (§4a) -----------------------------------------------------------------


def test_an_instance_turn_on_the_wire(fake, broker, schemas):
    wire = []
    with Client(broker, fake.prefix, instance="pod-1", schemas=schemas,
                wire_log=lambda d, m: wire.append((d, m))) as c:
        assert c.instance is not None and c.instance.queue == f"{fake.prefix}.instance.pod-1"
        s = c.open_session()
        sub = s.submit_turn("t1", "hello")
        reply = s.next_event(10)
        assert not queue_exists(broker, f"{fake.prefix}.session.{s.session_id}")
    assert isinstance(reply, Final) and reply.text == "echo: hello" and reply.session_id == s.session_id
    props, req, key = fake.requests[0]
    assert key == s.session_id and props.reply_to == c.instance.queue == sub.reply_to
    assert (props.delivery_mode, props.content_type) == (2, "application/json")
    assert props.message_id == sub.message_id
    assert wire[0][1]["properties"]["reply_to"] == c.instance.queue
    assert wire[1][1]["queue"] == c.instance.queue


def test_many_sessions_share_one_instance_queue(fake, broker):
    with Client(broker, fake.prefix, instance="pod-2") as c:
        sessions = [c.open_session() for _ in range(5)]
        for turn in range(3):
            for s in sessions:
                s.submit_turn(f"t{turn}", f"@stream {turn}" if turn == 1 else f"q{turn}", stream=turn == 1)
        for s in reversed(sessions):  # read in another order than they arrive
            events = [s.next_event(10) for _ in range(6)]  # t0, 3 deltas of t1, t1, t2
            finals = [e for e in events if isinstance(e, Final)]
            assert [f.turn_id for f in finals] == ["t0", "t1", "t2"], s.session_id
            assert all(e.session_id == s.session_id for e in events)
        for s in sessions:
            assert not queue_exists(broker, f"{fake.prefix}.session.{s.session_id}")
    assert {r[0].reply_to for r in fake.requests} == {f"{fake.prefix}.instance.pod-2"}


def test_instance_duplicates_are_dropped_and_tool_results_carry_reply_to(fake, broker):
    with Client(broker, fake.prefix, instance="pod-3") as c:
        s = c.open_session()
        s.submit_turn("t1", "@dup")
        assert s.next_event(10).turn_id == "t1"
        s._pending_calls["t2"] = ["c1"]  # as if a ToolCalls for t2 had asked for c1
        sub = s.submit_tool_results("t2", [ToolResult.ok("c1", 1)])
        assert s.next_event(10).turn_id == "t2"
        assert s.duplicates_dropped == 1
    assert fake.requests[-1][0].reply_to == sub.reply_to == f"{fake.prefix}.instance.pod-3"


def test_replies_for_a_session_not_yet_open_wait_for_it(fake, broker):
    with Client(broker, fake.prefix, instance="pod-4") as c:
        first = c.open_session()
        first.submit_turn("t1", "before a restart")
        first.close()  # the session is not open while its reply arrives
        deadline = 50
        while first.session_id not in c.instance.pending_sessions() and deadline:
            c.pump(0.1)
            deadline -= 1
        assert c.instance.pending_sessions() == [first.session_id]
        again = c.open_session(first.session_id)
        reply = again.next_event(10)
        assert isinstance(reply, Final) and reply.text == "echo: before a restart"


def test_the_instance_queue_is_durable_with_no_arguments(fake, broker):
    with Client(broker, fake.prefix, instance="pod-5") as c:
        queue = c.instance.queue
    admin = pika.BlockingConnection(pika.URLParameters(broker))
    ch = admin.channel()
    ok = ch.queue_declare(queue, durable=True, arguments={})  # what the client declared, again
    assert ok.method.queue == queue
    ch.queue_delete(queue)
    admin.close()


# --- tenants -------------------------------------------------------------------------------------


def test_the_broker_refuses_a_user_id_that_is_not_the_connections(broker, prefix):
    """Why `user_id` can name the tenant: RabbitMQ closes the channel (406) of a publish whose
    `user_id` is not the connection's user."""
    conn = pika.BlockingConnection(pika.URLParameters(broker))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.basic_publish("", f"{prefix}.nowhere", b"{}",
                             pika.BasicProperties(user_id=url_user(broker) + "-x"))
        assert e.value.reply_code == 406, e.value
    finally:
        conn.close()


def test_a_tenant_turn_on_the_wire(fake, broker, schemas):
    fake.tenants[url_user(broker)] = "t1"
    with Client(broker, fake.prefix, tenant="t1", schemas=schemas) as c:
        assert c.tenant == "t1"
        s = c.open_session()
        assert s.queue == f"{fake.prefix}.session.t1.{s.session_id}" and s.reply_to is None
        sub = s.submit_turn("t1", "hello tenant")
        reply = s.next_event(10)
        assert not queue_exists(broker, session_queue(fake.prefix, s.session_id)), "none without the tenant"
    assert isinstance(reply, Final) and reply.text == "echo: hello tenant"
    props, _, key = fake.requests[0]
    assert key == s.session_id and props.message_id == sub.message_id
    assert props.user_id == c.user_id == url_user(broker) and props.reply_to is None
    assert queue_exists(broker, s.queue)  # durable, still there after the client closed


def test_a_tenant_instance_turn_on_the_wire(fake, broker):
    with Client(broker, fake.prefix, tenant="t1", instance="pod-6") as c:
        queue = f"{fake.prefix}.instance.t1.pod-6"
        assert c.instance is not None and c.instance.queue == queue
        s = c.open_session()
        sub = s.submit_turn("t1", "hello")
        reply = s.next_event(10)
    assert isinstance(reply, Final) and reply.session_id == s.session_id
    props = fake.requests[0][0]
    assert props.reply_to == sub.reply_to == queue and props.user_id == url_user(broker)


# --- resuming by itself, and a queue the broker stopped consuming ------------------------------


def test_a_refused_resume_the_client_sent_by_itself_is_not_the_turns_reply(fake, broker):
    """A resume the client sends on its own (here: its channel replaced, as after a nack or a
    reconnect) that the server refuses is not handed to the application: the turn's own reply
    is what ends `turn_events`."""
    fake.refuse_resumes = True
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@hold", stream=True)
        s._reopen()  # what a nack or a reconnect does: the streamed turn is resumed
        wait_for(lambda: any(r[0].type == "turn.resume" for r in fake.requests))
        c.pump(0.3)  # the refusal arrives
        fake.finish("t1")
        events = list(s.turn_events("t1", 10))
        assert s.resumes == 1
    assert [type(e) for e in events] == [Final], events


def test_a_refused_submission_of_a_streamed_turn_does_not_end_its_resuming(fake, broker):
    """A refusal is final for its own submission only (§6): another submission of a running
    turn refused, the turn goes on, and the client still resumes it when its channel is
    replaced."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@hold", stream=True)
        s.submit({"SessionId": s.session_id, "TurnId": "t1", "Instruction": "@refuse"})
        refused = s.next_event(10, "t1")
        assert isinstance(refused, Refused) and refused.code == "turn.conflict", refused
        s._reopen()
        wait_for(lambda: any(r[0].type == "turn.resume" for r in fake.requests))
        c.pump(0.3)  # the notice
        fake.finish("t1")
        assert isinstance(s.next_event(10, "t1"), Final)


def test_a_streamed_turn_whose_own_request_is_refused_is_not_resumed(fake, broker):
    """The request that would start the turn refused (nothing stored): there is no turn to
    resume, so a replaced channel sends no resume for it."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@busy", stream=True)
        refused = s.next_event(10, "t1")
        assert isinstance(refused, Refused) and refused.code == "session.busy", refused
        s.submit_turn("t2", "@hold", stream=True)
        s._reopen()
        wait_for(lambda: any(r[0].type == "turn.resume" for r in fake.requests))
        resumed = [r[1]["TurnId"] for r in fake.requests if r[0].type == "turn.resume"]
        assert resumed == ["t2"] and s.resumes == 1, resumed


def test_a_copy_of_a_streamed_turns_request_refused_as_an_attach_keeps_it_resumable(fake, broker):
    """A request sent again (a lost confirm) is an attach, refused past the resume limit: the
    turn exists and runs, so it is still resumed."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@attached", stream=True)
        refused = s.next_event(10, "t1")
        assert isinstance(refused, Refused) and refused.code == "limit.resumes_per_minute", refused
        s._reopen()
        wait_for(lambda: any(r[0].type == "turn.resume" for r in fake.requests))
        assert s.resumes == 1


def test_a_session_whose_queue_the_broker_deleted_consumes_it_again(fake, broker):
    """The broker cancels the consumer of a deleted queue (as when the queue's node is lost):
    the session declares and consumes it again, and the next reply arrives."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "one")
        assert isinstance(s.next_event(10), Final)
        admin = pika.BlockingConnection(pika.URLParameters(broker))
        admin.channel().queue_delete(s.queue)
        admin.close()
        c.pump(0.3)  # the broker's basic.cancel
        s.submit_turn("t2", "two")
        e = s.next_event(10)
        assert isinstance(e, Final) and e.turn_id == "t2", e
        assert s.restores == 1


def test_a_session_whose_channel_the_broker_closed_consumes_its_queue_again(fake, broker):
    """The broker closes the session's channel (here an ack of a delivery tag it never gave, as
    its consumer timeout would): the next `next_event` opens a channel, declares and consumes
    the queue again, and the reply published meanwhile arrives."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.submit_turn("t1", "@hold")
        s._ch.basic_ack(delivery_tag=999_999)  # 406 PRECONDITION_FAILED closes the channel
        c.pump(0.3)
        assert not s._ch.is_open
        fake.finish("t1")
        e = s.next_event(10)
        assert isinstance(e, Final) and e.turn_id == "t1", e
        assert s.restores == 1


def test_an_upper_case_session_id_is_written_in_lower_case(fake, broker):
    with Client(broker, fake.prefix) as c:
        s = c.open_session(S2.upper())
        assert s.session_id == S2 and s.queue.endswith(S2)
        s.submit_turn("t1", "hello")
        assert s.next_event(10).session_id == S2
        with pytest.raises(ValueError):
            c.open_session(S2 + "\n")
    assert fake.requests[0][1]["SessionId"] == S2


def test_a_queue_the_user_may_not_declare_is_an_error_not_a_wait(fake, broker):
    """Restoring a queue the broker refuses for good (403: the user may not declare it; here a
    reserved `amq.` name) raises the broker's refusal instead of trying until the timeout."""
    with Client(broker, fake.prefix) as c:
        s = c.open_session()
        s.queue = "amq.aptix-forbidden"
        s._ch.basic_ack(delivery_tag=999_999)  # the broker closes the channel: it is restored
        c.pump(0.3)
        started = time.monotonic()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            s.next_event(10)
        assert refused.value.reply_code == 403 and time.monotonic() - started < 5
