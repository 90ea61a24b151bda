"""The client against the REAL pipeline (`aptix run` + `aptix sim`, started by clients/run-tests.sh):
a plain turn, a client tool round trip with a streamed follow-up, a duplicate, a conflict,
validation refusals, and a load round of 20 sessions x 5 turns published at once. Then replies per
instance (protocol §4a): 10 sessions x 3 turns on one instance queue, a tool round trip and a
take-over by another instance, and the refusal of a `reply_to` that names no reply queue. Then
cancels (protocol §7a): of a queued and of a streaming turn, of a turn waiting for tool results,
and the refusals of cancels that change nothing.

Every received body is checked against the repository's schemas and every header against
protocol v3 (the client does both when built with `schemas=` and `strict=True`).
"""

import json
import os
import struct
import subprocess
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import pika
import pika.exceptions

from aptix_client import (CODE_REPLY_TO_INVALID, CODE_SESSION_BUSY, CODE_TOOL_RESULTS_TURN_CANCELLED, CODE_TURN_CANCELLED,
                          CODE_TURN_STEERED,
                          CODE_TURN_FINISHED, CODE_TURN_NOT_FOUND, Client, Delta, EventTimeout, Failed, Final,
                          H_PROTOCOL, PROTOCOL_VERSION, Refused, ToolCalls, ToolResult, session_queue)
from conftest import queue_exists, sim_control

WAIT = 90.0


@pytest.fixture
def client(pipeline, schemas):
    with Client(pipeline.amqp_url, pipeline.prefix, schemas=schemas, strict=True) as c:
        yield c


def llm_calls_mentioning(pipeline, marker: str) -> int:
    """How many Responses API requests the simulator logged whose body mentions `marker`."""
    with urllib.request.urlopen(f"{pipeline.sim_url.removesuffix('/v1')}/_sim/requests", timeout=10) as r:
        bodies = json.load(r)
    return sum(marker in json.dumps(b) for b in bodies)


def streamed_step_one(s, calls):
    """Reads turn t1's second step, which answers `calls`: deltas in order, then the final reply
    whose text they make up. Returns (final, deltas)."""
    second = list(s.turn_events("t1", WAIT))
    final, deltas = second[-1], second[:-1]
    assert isinstance(final, Final), second
    assert final.step == 1 and final.message_id == f"reply:{s.session_id}:t1:step-1"
    assert f"tool_output {calls.calls[0].tool_call_id}" in final.text, final.text
    assert len(deltas) >= 3 and all(isinstance(d, Delta) and d.step == 1 for d in deltas)
    assert [d.seq for d in deltas] == list(range(len(deltas))), "deltas in order, no gaps"
    assert "".join(d.text for d in deltas) == final.text
    return final, deltas


def test_a_user_turn_gets_its_final_reply(client):
    s = client.open_session()
    sub = s.submit_turn("t1", "hello from python")
    events = list(s.turn_events("t1", WAIT))
    assert len(events) == 1, events
    reply = events[0]
    assert isinstance(reply, Final), reply
    assert reply.final and reply.outcome == "final" and reply.step == 0
    assert reply.message_id == f"reply:{s.session_id}:t1:step-0"
    assert "instruction: hello from python" in reply.text.splitlines(), reply.text
    assert reply.result["SessionId"] == s.session_id and reply.result["TurnId"] == "t1"
    assert reply.traceparent and sub.message_id
    with pytest.raises(EventTimeout):
        s.next_event(1.0)


def test_a_session_id_spelt_in_upper_case_gets_its_replies(client):
    """A GUID as .NET or Windows writes it: the client writes it in lower case, as the server
    does, so its queue is the one the replies go to."""
    sid = str(uuid.uuid4())
    s = client.open_session(sid.upper())
    assert s.session_id == sid
    reply = s.run_turn("t1", "hello in capitals", timeout=WAIT)
    assert isinstance(reply, Final) and reply.session_id == sid, reply


def test_a_clients_trace_context_is_continued_with_its_sampling_decision(client):
    # docs/client-protocol.md: a client's traceparent is continued by every message of the turn.
    s = client.open_session()
    trace = uuid.uuid4().hex
    for turn, flags in (("t1", "01"), ("t2", "00")):
        s.submit_turn(turn, "traced", traceparent=f"00-{trace}-{uuid.uuid4().hex[:16]}-{flags}")
        [reply] = list(s.turn_events(turn, WAIT))
        version, trace_id, span_id, got_flags = reply.traceparent.split("-")
        assert (version, trace_id, got_flags) == ("00", trace, flags), reply.traceparent
        assert len(span_id) == 16 and span_id != "0" * 16


def test_tool_round_trip_then_a_streamed_follow_up(client):
    s = client.open_session()
    s.submit_turn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})', stream=True)
    first = list(s.turn_events("t1", WAIT))
    calls = first[-1]
    assert isinstance(calls, ToolCalls), first
    assert not calls.final and calls.outcome == "client_tool_continuation" and calls.step == 0
    assert calls.message_id == f"reply:{s.session_id}:t1:step-0"
    assert [c.name for c in calls.calls] == ["read_file"]
    assert calls.calls[0].arguments == {"path": "src/lib.rs"}
    assert all(isinstance(e, Delta) and e.step == 0 for e in first[:-1])
    assert calls.traceparent, "traceparent on every reply"

    results = [ToolResult.ok(c, {"contents": "pub fn answer() -> u32 { 42 }"}, 3) for c in calls.calls]
    s.submit_tool_results("t1", results)
    final, deltas = streamed_step_one(s, calls)
    for d in deltas:
        assert d.message_id == f"delta:{s.session_id}:t1:1:{d.seq}"
    assert final.traceparent and calls.traceparent.split("-")[1] == final.traceparent.split("-")[1], \
        "one trace per turn"


def test_a_duplicate_gets_the_stored_reply_without_a_second_llm_call(client, pipeline):
    marker = f"dup-{uuid.uuid4().hex}"
    s = client.open_session()
    s.submit_turn("t1", marker)
    first = s.next_event(WAIT, "t1")
    assert isinstance(first, Final)
    assert llm_calls_mentioning(pipeline, marker) == 1

    s.submit_turn("t1", marker)  # same TurnId, same content, a new submission
    second = s.next_event(WAIT, "t1")
    assert isinstance(second, Final) and second.resent, second
    assert second.body == first.body
    assert second.message_id.startswith(f"reply:{s.session_id}:t1:resent-")
    assert llm_calls_mentioning(pipeline, marker) == 1, "a duplicate must not call the LLM"


def test_a_conflict_is_refused(client):
    s = client.open_session()
    assert isinstance(s.run_turn("t1", "the original", timeout=WAIT), Final)
    s.submit_turn("t1", "something else")
    reply = s.next_event(WAIT, "t1")
    assert isinstance(reply, Refused), reply
    assert reply.code == "turn.conflict" and reply.outcome == "refused"
    assert reply.message_id.startswith(f"reply:{s.session_id}:t1:conflict-")
    # The refusal changed nothing: the turn's stored answer is still what a duplicate gets.
    s.submit_turn("t1", "the original")
    assert isinstance(s.next_event(WAIT, "t1"), Final)


def test_validation_refusals(client):
    s = client.open_session()  # a session the server has never seen: only the client declared it
    s.submit({"SessionId": s.session_id, "TurnId": "t1", "Instruction": "x", "Mode": "DDR"},
                   validate=False)
    reply = s.next_event(WAIT)
    assert isinstance(reply, Refused), reply
    assert reply.code == "request.forbidden_field" and reply.turn_id == "t1"
    assert reply.message_id.startswith(f"reply:{s.session_id}:t1:rejected-")

    s.submit({"SessionId": s.session_id, "TurnId": "turn 2", "Instruction": "x"}, validate=False)
    reply = s.next_event(WAIT)
    assert isinstance(reply, Refused) and reply.code == "validation.turn_id_invalid", reply
    assert reply.turn_id is None and reply.message_id.startswith(f"reply:{s.session_id}:-:rejected-")

    # A refused submission left no turn behind: the same TurnId still starts a turn.
    assert isinstance(s.run_turn("t1", "now valid", timeout=WAIT), Final)


def test_load_20_sessions_x_5_turns_exactly_once_in_order(client):
    sessions = [client.open_session() for _ in range(20)]
    for turn in range(5):
        for s in sessions:
            s.submit_turn(f"t{turn}", f"question {turn} of {s.session_id}")
    finals = defaultdict(list)
    for s in sessions:
        while len(finals[s.session_id]) < 5:
            event = s.next_event(WAIT)
            assert isinstance(event, Final), event
            finals[s.session_id].append(event)
    for s in sessions:
        got = finals[s.session_id]
        assert [e.turn_id for e in got] == [f"t{i}" for i in range(5)], f"order in {s.session_id}"
        counts = Counter((e.session_id, e.turn_id) for e in got)
        assert set(counts.values()) == {1}
        for i, e in enumerate(got):
            assert f"instruction: question {i} of {s.session_id}" in e.text.splitlines(), e.text
            assert f"chain_depth: {i + 1}" in e.text, "turns of a session ran one at a time, in order"
        assert s.duplicates_dropped == 0, "the broker delivered a reply twice"
    for s in sessions:
        with pytest.raises(EventTimeout):
            s.next_event(0.2)


def test_the_readme_example_runs_a_tool_round_trip(pipeline, capsys):
    """The README's first example, run as printed (its URL, prefix and question replaced) on a
    turn that calls one of the client's tools: it sends the tool's result and prints the final
    answer, which the model wrote from that result."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    for old, new in (('"amqp://guest:guest@127.0.0.1:5672/%2f"', repr(pipeline.amqp_url)),
                     ('prefix="aptix"', f"prefix={pipeline.prefix!r}"),
                     ('"Where is the retry policy?"', repr("tools @call(run_tests)"))):
        assert old in code, old
        code = code.replace(old, new)
    ran = []

    def run_my_tool(name, arguments):
        ran.append(name)
        return {"passed": 7}

    exec(compile(code, "README.md", "exec"), {"run_my_tool": run_my_tool, "may_run": lambda call: False})
    printed = capsys.readouterr().out
    assert ran == ["run_tests"], ran
    assert "tool_output " in printed and "passed" in printed, printed


def test_every_received_reply_is_stored_as_received(client, pipeline):
    """`aptix session show` holds the conversation the client saw: step replies in `records`
    (by turn and step), the others (refusals, re-sent replies) in `replies`."""
    if not os.environ.get("APTIX_TEST_BIN"):
        pytest.skip("APTIX_TEST_BIN names no aptix binary")
    s = client.open_session()
    received = []
    s.submit({"SessionId": s.session_id, "TurnId": "t0", "Instruction": "x", "Mode": "DDR"}, validate=False)
    received.append(s.next_event(WAIT))
    received.append(s.run_turn("t1", 'tools @call(run_tests)', timeout=WAIT, on_event=received.append,
                               tools=lambda c: ToolResult.error(c, "no tests matched", 2)))
    s.submit_turn("t1", 'tools @call(run_tests)')   # duplicate
    received.append(s.next_event(WAIT, "t1"))
    s.submit_turn("t1", "other")                     # conflict
    received.append(s.next_event(WAIT, "t1"))
    replies = {e.message_id: e for e in received if not isinstance(e, Delta)}
    assert len(replies) == 5, list(replies)
    shown = subprocess.run([os.environ["APTIX_TEST_BIN"], "session", "show", s.session_id],
                           capture_output=True, text=True, timeout=60, check=True)
    history = json.loads(shown.stdout)
    stored = {r["message_id"]: r["body"] for r in history["replies"]}
    stored.update({f"reply:{s.session_id}:{r['turn_id']}:step-{r['step']}": r["reply"]
                   for r in history["records"]})
    assert set(stored) == set(replies)
    for mid, event in replies.items():
        assert stored[mid] == event.body, mid
    outcomes = {r["message_id"]: r["outcome"] for r in history["replies"]}
    assert all(outcomes[m] == replies[m].outcome for m in outcomes)


# --- replies per instance (docs/client-protocol.md §4a) ------------------------------------------


@pytest.fixture
def instances(pipeline, schemas):
    """Opens clients in instance mode (a fresh instance name each); deletes their queues after."""
    opened = []

    def open_instance() -> Client:
        c = Client(pipeline.amqp_url, pipeline.prefix, instance=f"py-{uuid.uuid4().hex[:12]}",
                   schemas=schemas, strict=True)
        opened.append(c)
        return c

    yield open_instance
    for c in opened:
        assert c.instance is not None
        if c.instance.channel.is_open:
            c.instance.delete_queue()
        c.close()



def test_instance_10_sessions_x_3_turns_on_one_queue(instances, pipeline):
    c = instances()
    assert c.instance is not None
    sessions = [c.open_session() for _ in range(10)]
    for turn in range(3):
        for s in sessions:
            sub = s.submit_turn(f"t{turn}", f"instance question {turn} of {s.session_id}")
            assert sub.reply_to == c.instance.queue
    finals = defaultdict(list)
    for s in reversed(sessions):  # reading one session lets the others' messages wait in order
        while len(finals[s.session_id]) < 3:
            event = s.next_event(WAIT)
            assert isinstance(event, Final), event
            finals[s.session_id].append(event)
    for s in sessions:
        got = finals[s.session_id]
        assert [e.turn_id for e in got] == ["t0", "t1", "t2"], f"order in {s.session_id}"
        for i, e in enumerate(got):
            assert e.session_id == s.session_id and e.headers["x-aptix-session-id"] == s.session_id
            assert e.headers[H_PROTOCOL] == PROTOCOL_VERSION, "the server speaks the version this client is for"
            assert e.message_id == f"reply:{s.session_id}:t{i}:step-0"
            assert f"instruction: instance question {i} of {s.session_id}" in e.text.splitlines(), e.text
            assert f"chain_depth: {i + 1}" in e.text, "turns of a session ran one at a time, in order"
        assert s.duplicates_dropped == 0, "the broker delivered a reply twice"
    for s in sessions:
        with pytest.raises(EventTimeout):
            s.next_event(0.2)
    assert c.instance.pending_sessions() == [] and c.instance.unroutable == []
    for s in sessions:
        assert not queue_exists(pipeline.amqp_url, session_queue(pipeline.prefix, s.session_id)), \
            f"a session queue was created for {s.session_id}"
    assert queue_exists(pipeline.amqp_url, c.instance.queue)


def test_instance_tool_round_trip(instances, pipeline):
    c = instances()
    s = c.open_session()
    s.submit_turn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})', stream=True)
    first = list(s.turn_events("t1", WAIT))
    calls = first[-1]
    assert isinstance(calls, ToolCalls), first
    assert calls.step == 0 and calls.message_id == f"reply:{s.session_id}:t1:step-0"
    assert [x.name for x in calls.calls] == ["read_file"]
    assert all(isinstance(e, Delta) and e.step == 0 for e in first[:-1])

    results = [ToolResult.ok(x, {"contents": "pub fn answer() -> u32 { 42 }"}, 3) for x in calls.calls]
    sub = s.submit_tool_results("t1", results)
    assert sub.reply_to == s.reply_to == c.instance.queue
    streamed_step_one(s, calls)
    with pytest.raises(EventTimeout):
        s.next_event(0.5)
    assert not queue_exists(pipeline.amqp_url, session_queue(pipeline.prefix, s.session_id))


def test_the_next_step_goes_to_the_instance_that_submitted_the_results(instances, pipeline):
    """§4a: a step's replies go to the `reply_to` of the submission that started it, and a
    reply that answers a submission (a stored reply re-sent to a duplicate) to that one's."""
    a, b = instances(), instances()
    on_a = a.open_session()
    on_a.submit_turn("t1", "tools @call(run_tests)")
    calls = on_a.next_event(WAIT, "t1")
    assert isinstance(calls, ToolCalls) and calls.step == 0, calls

    on_b = b.open_session(on_a.session_id)  # another instance takes the session over
    sub = on_b.submit_tool_results("t1", [ToolResult.error(x, "no tests matched", 2) for x in calls.calls])
    assert sub.reply_to == b.instance.queue
    final = on_b.next_event(WAIT, "t1")
    assert isinstance(final, Final) and final.step == 1, final
    with pytest.raises(EventTimeout):
        on_a.next_event(1.0)

    on_a.submit_turn("t1", "tools @call(run_tests)")  # a duplicate, submitted through a
    resent = on_a.next_event(WAIT, "t1")
    assert isinstance(resent, Final) and resent.resent and resent.body == final.body, resent
    with pytest.raises(EventTimeout):
        on_b.next_event(0.5)
    assert not queue_exists(pipeline.amqp_url, session_queue(pipeline.prefix, on_a.session_id))


def test_a_reply_to_that_names_no_reply_queue_is_refused(client, pipeline):
    s = client.open_session()  # per session: the refusal comes to the declared session queue
    prefix = pipeline.prefix
    bad = [
        f"{prefix}.requests",
        session_queue(prefix, str(uuid.uuid4())),  # another session's queue
        f"{prefix}.instance.",                     # no instance name
        f"{prefix}.instance.{'x' * 65}",           # a name too long
        f"{prefix}.instance.bad name",             # a character outside [A-Za-z0-9._-]
        f"other-{prefix}.instance.pod-1",          # another deployment's instance queue
    ]
    for reply_to in bad:
        sub = s.submit({"SessionId": s.session_id, "TurnId": "t1", "Instruction": "x"}, reply_to=reply_to)
        reply = s.next_event(WAIT)
        assert isinstance(reply, Refused), (reply_to, reply)
        assert reply.code == CODE_REPLY_TO_INVALID, (reply_to, reply.errors)
        assert reply.turn_id == "t1" and reply.correlation_id == sub.message_id, reply_to
        assert reply.message_id.startswith(f"reply:{s.session_id}:t1:rejected-"), reply.message_id

    # RabbitMQ's direct reply-to: the publishing channel consumes `amq.rabbitmq.reply-to` (else
    # the broker closes it), and the server receives `amq.rabbitmq.reply-to.<token>`.
    conn = pika.BlockingConnection(pika.URLParameters(pipeline.amqp_url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=True)
        mid = str(uuid.uuid4())
        body = json.dumps({"SessionId": s.session_id, "TurnId": "t1", "Instruction": "x"}).encode()
        ch.basic_publish(f"{prefix}.requests", s.session_id, body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id=mid,
            reply_to="amq.rabbitmq.reply-to"), mandatory=True)
        reply = s.next_event(WAIT)
    finally:
        conn.close()
    assert isinstance(reply, Refused) and reply.code == CODE_REPLY_TO_INVALID, reply
    assert reply.correlation_id == mid

    # Nothing changed: the session's own queue as reply_to is the default, and t1 still starts.
    s.submit({"SessionId": s.session_id, "TurnId": "t1", "Instruction": "now valid"}, reply_to=s.queue)
    final = s.next_event(WAIT, "t1")
    assert isinstance(final, Final) and final.message_id == f"reply:{s.session_id}:t1:step-0", final


def _publish_raw(pipeline, session_id: str, body: dict, message_id=None, **properties):
    """Publishes as a hostile client would, with properties pika sends byte for byte."""
    conn = pika.BlockingConnection(pika.URLParameters(pipeline.amqp_url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        mid = message_id or str(uuid.uuid4())
        ch.basic_publish(f"{pipeline.prefix}.requests", session_id, json.dumps(body).encode(),
                         pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                              message_id=mid, **properties), mandatory=True)
        return mid
    finally:
        conn.close()


class _EncodedTable(dict):
    """A headers table that pika sends as the given bytes."""

    def __init__(self, raw: bytes):
        super().__init__()
        self.raw = raw


def test_a_property_that_is_not_utf8_is_refused_and_intake_goes_on(client, pipeline, monkeypatch):
    """RabbitMQ forwards short strings that are not UTF-8 and tables nested thousands deep; a
    strict AMQP client cannot read such a message (or overflows its stack), and the broker
    redelivers it to the next consumer forever (vendor/README.md). Both are answered, and the
    next turn runs."""
    s = client.open_session()
    mid = _publish_raw(pipeline, s.session_id, {"SessionId": s.session_id, "TurnId": "t1", "Instruction": "x"},
                       reply_to=f"{pipeline.prefix}.instance.\xff\xfe".encode("latin-1"))
    reply = s.next_event(WAIT)
    assert isinstance(reply, Refused) and reply.code == CODE_REPLY_TO_INVALID, reply
    assert reply.correlation_id == mid and any("not UTF-8" in e.message for e in reply.errors), reply.errors
    # A message_id of 255 bytes that are not UTF-8 reads as 255 bytes again (U+FFFD takes three:
    # cut to fit), so the refusal can carry it back as its correlation_id.
    _publish_raw(pipeline, s.session_id, {"SessionId": s.session_id, "TurnId": "t1", "Instruction": "x"},
                 message_id=b"\xff" * 255, reply_to=b"\xff")
    reply = s.next_event(WAIT)
    assert isinstance(reply, Refused) and reply.code == CODE_REPLY_TO_INVALID, reply
    assert reply.correlation_id == "\ufffd" * 85, reply.correlation_id

    # A header nested 20,000 arrays deep (100 KB, within one frame): read, nesting past what the
    # workers keep dropped; the turn itself is a valid one.
    import pika.data
    encode_table = pika.data.encode_table

    def encode(pieces, table):
        if isinstance(table, _EncodedTable):
            pieces.append(table.raw)
            return len(table.raw)
        return encode_table(pieces, table)

    monkeypatch.setattr(pika.data, "encode_table", encode)
    nested = b"V"
    for _ in range(20000):
        nested = b"A" + struct.pack(">I", len(nested)) + nested
    entry = bytes([4]) + b"deep" + nested
    deep = _EncodedTable(struct.pack(">I", len(entry)) + entry)
    _publish_raw(pipeline, s.session_id, {"SessionId": s.session_id, "TurnId": "t1", "Instruction": "deep"},
                 headers=deep)
    final = s.next_event(WAIT, "t1")
    assert isinstance(final, Final) and "instruction: deep" in final.text.splitlines(), final

    # A header of 40,000 characters: its properties frame is larger than the 32 KiB frames the
    # workers read with (RabbitMQ never splits properties across frames).
    _publish_raw(pipeline, s.session_id, {"SessionId": s.session_id, "TurnId": "t2", "Instruction": "big"},
                 headers={"big": "x" * 40000})
    final = s.next_event(WAIT, "t2")
    assert isinstance(final, Final) and "instruction: big" in final.text.splitlines(), final

    # Another session's turn: intake went on.
    other = client.open_session()
    other.submit_turn("t1", "after the hostile ones")
    final = other.next_event(WAIT, "t1")
    assert isinstance(final, Final), final


# --- cancelling a turn (docs/client-protocol.md §7a) --------------------------------------------


@pytest.fixture
def slow_stream(pipeline):
    """The simulator waits 100 ms between stream events while the test runs (other tests share it):
    an answer (about 40 text deltas: the simulator echoes only the instruction's first 120
    characters) then streams for about 4 s, well past a test's cancels."""
    sim_control(pipeline, {"command": "set_latency", "latency": {"per_event_ms": 100}})
    try:
        yield
    finally:
        sim_control(pipeline, {"command": "set_latency", "latency": {}})


def test_cancel_a_queued_and_a_streaming_turn_then_the_next_turn_runs(client, slow_stream):
    s = client.open_session()
    sid = s.session_id
    long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail " * 30
    s.submit_turn("t1", long, stream=True)
    s.submit_turn("t2", "queued, then cancelled")
    s.submit_turn("t3", "runs after both")
    while True:  # t1 runs and streams; t2 and t3 wait behind it
        delta = s.next_event(WAIT, "t1")
        assert isinstance(delta, Delta) and delta.step == 0, delta
        if delta.text:
            break

    c2 = s.cancel_turn("t2")
    t2 = s.next_event(WAIT, "t2")
    assert isinstance(t2, Failed), t2
    assert (t2.code, t2.outcome, t2.final, t2.step) == (CODE_TURN_CANCELLED, "failed", True, 0), t2
    assert t2.message_id == f"reply:{sid}:t2:step-0" and c2.kind == "turn.cancel"

    s.cancel_turn("t1")
    rest = list(s.turn_events("t1", WAIT))
    t1 = rest[-1]
    assert isinstance(t1, Failed), rest
    assert (t1.code, t1.final, t1.step) == (CODE_TURN_CANCELLED, True, 0), t1
    assert t1.message_id == f"reply:{sid}:t1:step-0"
    assert all(isinstance(d, Delta) and d.turn_id == "t1" for d in rest[:-1]), rest

    t3 = list(s.turn_events("t3", WAIT))
    assert len(t3) == 1 and isinstance(t3[0], Final), t3
    assert "instruction: runs after both" in t3[0].text.splitlines(), t3[0].text
    with pytest.raises(EventTimeout):  # nothing else came: no delta of t1 after its reply
        s.next_event(1.0)

    finished = s.cancel_turn("t3")
    s.cancel_turn("t2")  # already cancelled: no answer
    unknown = s.cancel_turn("nope")
    refused = s.next_event(WAIT, "t3")
    assert isinstance(refused, Refused), refused
    assert (refused.code, refused.outcome, refused.final) == (CODE_TURN_FINISHED, "refused", True), refused
    assert f"reply:{sid}:t3:rejected-cancel-" in refused.message_id
    assert refused.correlation_id == finished.message_id
    refused = s.next_event(WAIT, "nope")
    assert isinstance(refused, Refused) and refused.code == CODE_TURN_NOT_FOUND, refused
    assert refused.message_id.startswith(f"reply:{sid}:nope:rejected-cancel-")
    assert refused.reply_id.submission_tag == "rejected-cancel"
    assert refused.correlation_id == unknown.message_id
    with pytest.raises(EventTimeout):  # the repeated cancel of t2 got nothing
        s.next_event(2.0)


def test_cancel_a_turn_waiting_for_tool_results(client):
    s = client.open_session()
    sid = s.session_id
    s.submit_turn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})')
    calls = s.next_event(WAIT, "t1")
    assert isinstance(calls, ToolCalls) and calls.step == 0, calls

    s.cancel_turn("t1")
    ended = s.next_event(WAIT, "t1")
    assert isinstance(ended, Failed), ended
    assert (ended.code, ended.final, ended.step) == (CODE_TURN_CANCELLED, True, 1), ended
    assert ended.message_id == f"reply:{sid}:t1:step-1"

    late = s.submit_tool_results("t1", [ToolResult.ok(c, {"contents": "too late"}, 3) for c in calls.calls])
    refused = s.next_event(WAIT, "t1")
    assert isinstance(refused, Refused), refused
    assert refused.code == CODE_TOOL_RESULTS_TURN_CANCELLED, refused.errors
    assert refused.message_id.startswith(f"reply:{sid}:t1:rejected-continuation-")
    assert refused.correlation_id == late.message_id

    # The session is free again: the next turn runs.
    assert isinstance(s.run_turn("t2", "after the cancel", timeout=WAIT), Final)


def test_a_follow_up_chooses_its_policy_per_request(client, slow_stream):
    """§11 "Follow-ups": the default context lets a request choose any policy with `FollowUp`."""
    s = client.open_session()
    sid = s.session_id
    long = "Stream a long answer. " + "explain send_invoice_email and every retry path in detail " * 30
    s.submit_turn("t1", long, stream=True)
    while True:  # t1 runs and streams
        delta = s.next_event(WAIT, "t1")
        assert isinstance(delta, Delta), delta
        if delta.text:
            break

    s.submit_turn("t2", "refused while t1 runs", FollowUp="reject")
    busy = s.next_event(WAIT, "t2")
    assert isinstance(busy, Refused) and busy.code == CODE_SESSION_BUSY, busy
    assert busy.message_id.startswith(f"reply:{sid}:t2:rejected-busy-"), busy.message_id
    # The request schema lists the three; the server refuses another on its own, too.
    s.submit({"SessionId": sid, "TurnId": "t3", "Instruction": "a policy nobody knows", "FollowUp": "soon"},
             validate=False)
    invalid = s.next_event(WAIT, "t3")
    assert isinstance(invalid, Refused) and invalid.code == "validation.follow_up_invalid", invalid
    assert invalid.reply_id.submission_tag == "rejected", invalid.message_id

    s.submit_turn("t4", "stop that and answer this", FollowUp="interrupt")
    rest = list(s.turn_events("t1", WAIT))
    assert isinstance(rest[-1], Failed) and rest[-1].code == CODE_TURN_CANCELLED, rest[-1]
    t4 = list(s.turn_events("t4", WAIT))
    assert len(t4) == 1 and isinstance(t4[0], Final), t4
    assert "instruction: stop that and answer this" in t4[0].text.splitlines(), t4[0].text
    # t2 was refused, not stored: the same TurnId runs now that the session is idle.
    assert isinstance(s.run_turn("t2", "refused while t1 runs", timeout=WAIT), Final)


def test_a_follow_up_steers_the_turn_waiting_for_tool_results(client):
    """§11 "Follow-ups", `steer`: sent while t1 waits for tool results, t2 joins the call those
    results start, and its one reply is t1's ending told about t2, with a `turn.steered` warning."""
    s = client.open_session()
    sid = s.session_id
    s.submit_turn("t1", 'Read it @call(read_file, {"path":"src/lib.rs"})')
    calls = s.next_event(WAIT, "t1")
    assert isinstance(calls, ToolCalls), calls

    s.submit_turn("t2", "also name the first function", FollowUp="steer")
    s.submit_tool_results("t1", [ToolResult.ok(c, {"contents": "fn main() {}"}, 3) for c in calls.calls])
    t1 = s.next_event(WAIT, "t1")
    assert isinstance(t1, Final) and not t1.steered, t1
    # The model read t2's instruction last: the simulator answers the newest one.
    assert "instruction: also name the first function" in t1.text.splitlines(), t1.text
    t2 = s.next_event(WAIT, "t2")
    assert isinstance(t2, Final) and t2.steered, t2
    assert [w.code for w in t2.warnings] == [CODE_TURN_STEERED], t2.warnings
    assert (t2.message_id, t2.text, t2.usage) == (f"reply:{sid}:t2:step-0", t1.text, None)

    # A steer with a file is refused; with no turn running, a steer simply runs.
    s.submit({"SessionId": sid, "TurnId": "t3", "Instruction": "this file", "FollowUp": "steer",
              "InputArtifacts": [{"RelativePath": "src/a.rs", "FileName": "a.rs", "Contents": "fn a() {}",
                                  "Origin": "ide"}]})
    refused = s.next_event(WAIT, "t3")
    assert isinstance(refused, Refused) and refused.code == "validation.follow_up_invalid", refused
    t4 = s.run_turn("t4", "now this", timeout=WAIT, FollowUp="steer")
    assert isinstance(t4, Final) and not t4.steered, t4
