"""The client against the REAL pipeline (`aptix run` + `aptix sim`, started by clients/run-tests.sh):
a plain turn, a client tool round trip with a streamed follow-up, a duplicate, a conflict,
validation refusals, and a load round of 20 sessions x 5 turns published at once.

Every received body is checked against the repository's schemas and every header against
protocol v2 (the client does both when built with `schemas=` and `strict=True`).
"""

import json
import os
import subprocess
import urllib.request
import uuid
from collections import Counter, defaultdict

import pytest

from aptix_client import Client, Delta, EventTimeout, Final, Refused, ToolCalls, ToolResult

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
    second = list(s.turn_events("t1", WAIT))
    final, deltas = second[-1], second[:-1]
    assert isinstance(final, Final), second
    assert final.step == 1 and final.message_id == f"reply:{s.session_id}:t1:step-1"
    assert f"tool_output {calls.calls[0].tool_call_id}" in final.text, final.text
    assert len(deltas) >= 3 and all(isinstance(d, Delta) and d.step == 1 for d in deltas)
    assert [d.seq for d in deltas] == list(range(len(deltas))), "deltas in order, no gaps"
    assert "".join(d.text for d in deltas) == final.text
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
