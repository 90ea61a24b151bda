"""Typed events from reply-queue messages, and tool results on the wire."""

import json

import pytest

from aptix_client import (Delta, Failed, Final, ProtocolError, Refused, ToolCall, ToolCalls,
                          ToolResult, parse_event)

S = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f"
HEX = "0123456789abcdef01234567"


def headers(outcome, final, step=0, turn="t1"):
    h = {"x-aptix-session-id": S, "x-aptix-turn-id": turn, "x-aptix-kind": "reply",
         "x-aptix-final": final, "x-aptix-outcome": outcome}
    if step is not None:
        h["x-aptix-step"] = step
    return h


def body(result=None, errors=None):
    if errors is not None:
        return json.dumps({"Successful": False, "Result": None, "Errors": errors}).encode()
    return json.dumps({"Successful": True, "Result": result, "Errors": [], "Warnings": []}).encode()


def final_result(text="hello"):
    return {"SessionId": S, "TurnId": "t1", "ModeDisplayName": "General", "Kind": "final",
            "PrimaryOutputText": text}


def test_final():
    e = parse_event("reply", f"reply:{S}:t1:step-1", headers("final", True, 1), body(final_result()))
    assert isinstance(e, Final) and e.final and e.text == "hello" and e.step == 1
    assert e.turn_id == "t1" and not e.resent


def test_tool_calls():
    result = {"SessionId": S, "TurnId": "t1", "ModeDisplayName": "General",
              "Kind": "client_tool_continuation",
              "ToolCalls": [{"ToolCallId": "c1", "Name": "read_file", "ArgumentsJson": "{\"path\":\"a\"}"},
                            {"ToolCallId": "c2", "Name": "run_tests", "ArgumentsJson": "{}"}]}
    e = parse_event("reply", f"reply:{S}:t1:step-0", headers("client_tool_continuation", False),
                    body(result))
    assert isinstance(e, ToolCalls) and not e.final
    assert [c.tool_call_id for c in e.calls] == ["c1", "c2"]
    assert e.calls[0].arguments == {"path": "a"}


def test_failed_and_refused():
    errs = [{"Code": "turn.conflict", "Message": "used", "Field": "TurnId"}]
    r = parse_event("reply", f"reply:{S}:t1:conflict-{HEX}", headers("refused", True, None),
                    body(errors=errs), correlation_id="m1")
    assert isinstance(r, Refused) and r.code == "turn.conflict" and r.correlation_id == "m1"
    f = parse_event("reply", f"reply:{S}:t1:step-0", headers("failed", True),
                    body(errors=[{"Code": "llm.refused", "Message": "no"}]))
    assert isinstance(f, Failed) and f.errors[0].code == "llm.refused"


def test_refusal_without_turn():
    r = parse_event("reply", f"reply:{S}:-:rejected-{HEX}", headers("refused", True, None, turn="-"),
                    body(errors=[{"Code": "validation.turn_id_invalid", "Message": "x"}]))
    assert isinstance(r, Refused) and r.turn_id is None


def test_a_failed_body_names_its_session_and_turn():
    named = json.dumps({"Successful": False, "Result": None, "Warnings": [],
                        "Errors": [{"Code": "llm.unavailable", "Message": "down"}],
                        "SessionId": S, "TurnId": "t1"}).encode()
    f = parse_event("reply", f"reply:{S}:t1:step-0", headers("failed", True), named)
    assert isinstance(f, Failed) and (f.body_session_id, f.body_turn_id) == (S, "t1")
    # Without headers (lenient mode) the body still says whose turn failed.
    lenient = parse_event("reply", "r1", {}, named, strict=False)
    assert isinstance(lenient, Failed) and (lenient.session_id, lenient.turn_id) == (S, "t1")
    # A body without them (a request naming no valid TurnId, or an older server) reads as before.
    old = parse_event("reply", f"reply:{S}:-:rejected-{HEX}", headers("refused", True, None, turn="-"),
                      body(errors=[{"Code": "validation.turn_id_invalid", "Message": "x"}]))
    assert (old.body_session_id, old.body_turn_id, old.turn_id) == (None, None, None)


def test_resent_is_recognised():
    e = parse_event("reply", f"reply:{S}:t1:resent-{HEX}", headers("final", True), body(final_result()))
    assert isinstance(e, Final) and e.resent


def test_delta():
    h = {"x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta",
         "x-aptix-step": 1, "x-aptix-seq": 4}
    b = json.dumps({"Delta": True, "SessionId": S, "TurnId": "t1", "Step": 1, "Seq": 4,
                    "Event": {"Type": "OutputText", "OutputIndex": 0, "Text": "Hi"}}).encode()
    e = parse_event("delta", f"delta:{S}:t1:1:4", h, b)
    assert isinstance(e, Delta) and (e.step, e.seq, e.text, e.event_type) == (1, 4, "Hi", "OutputText")


def test_body_must_agree_with_outcome():
    with pytest.raises(ProtocolError, match="Successful"):
        parse_event("reply", f"reply:{S}:t1:step-0", headers("final", True),
                    body(errors=[{"Code": "internal.error", "Message": "x"}]))
    with pytest.raises(ProtocolError, match="final"):
        parse_event("reply", f"reply:{S}:t1:step-0", headers("final", False), body(final_result()))


def test_lenient_mode_infers_from_the_body():
    e = parse_event("reply", "r1", {"x-aptix-turn-id": "t1"}, body(final_result()), strict=False)
    assert isinstance(e, Final) and e.final


def test_tool_results_on_the_wire():
    call = ToolCall("c1", "read_file", "{}")
    assert ToolResult.ok(call, {"a": 1}, 5).to_wire() == {
        "ToolCallId": "c1", "ExecutionMs": 5, "ResultJson": "{\"a\": 1}"}
    assert ToolResult.error("c2", "boom").to_wire() == {
        "ToolCallId": "c2", "ExecutionMs": 0, "ErrorMessage": "boom"}
