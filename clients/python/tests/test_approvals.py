"""Approval gates (protocol v3, docs/tools.md "Approvals") against the REAL pipeline, as the docs
tell a client to use them: clients/run-tests.sh adds a ConversationContext whose `write_file`
calls under `deploy/` wait for the client's approval. An approved call runs once, however often
its decisions are sent; a denied one never runs and the model reads the message; decisions that
do not match abort the turn; a waiting turn refuses new turns and can be cancelled.
"""

import os

import pytest

from aptix_client import (CODE_TOOL_RESULTS_TURN_CANCELLED, CODE_TURN_CANCELLED, OUTCOME_APPROVAL, ApprovalRequired,
                          Client, EventTimeout, Failed, Final, Refused, ToolDecision)

GATED = os.environ.get("APTIX_TEST_GATED_CONVERSATION_CONTEXT")
pytestmark = pytest.mark.skipif(not GATED, reason="needs clients/run-tests.sh's gated ConversationContext")
WAIT = 90.0
GATED_WRITE = '@call(write_file, {"path": "deploy/run.sh", "content": "echo hi", "mime_type": null})'
FREE_WRITE = '@call(write_file, {"path": "notes/run.md", "content": "hi", "mime_type": null})'


@pytest.fixture
def client(pipeline, schemas):
    with Client(pipeline.amqp_url, pipeline.prefix, schemas=schemas, strict=True) as c:
        yield c


def ask(s, turn_id: str, instruction: str) -> ApprovalRequired:
    s.submit_turn(turn_id, instruction, ConversationContextId=GATED)
    event = s.next_event(WAIT, turn_id)
    assert isinstance(event, ApprovalRequired), event
    assert event.outcome == OUTCOME_APPROVAL and not event.final and event.step == 0, event
    assert event.message_id == f"reply:{s.session_id}:{turn_id}:step-0"
    assert [c.name for c in event.calls] == ["write_file"], event.calls
    assert event.expires_at.endswith("Z"), event.expires_at
    return event


def test_an_approved_call_runs_once_however_often_it_is_approved(client):
    s = client.open_session()
    asked = ask(s, "t1", f"ship it {GATED_WRITE}")
    sub = s.submit_approvals("t1", [ToolDecision.approve(asked.calls[0])])
    s.submit_approvals("t1", [ToolDecision.approve(asked.calls[0])], message_id=sub.message_id)
    final = s.next_event(WAIT, "t1")
    assert isinstance(final, Final) and final.step == 1, final
    files, results = final.result.get("Files") or [], final.result["ToolResults"]
    assert [f["Name"] for f in files] == ["run.sh"], files
    assert [r["Name"] for r in results] == ["write_file"] and "ResultJson" in results[0], results
    # The copy changed nothing: no second step, no refusal.
    with pytest.raises(EventTimeout):
        s.next_event(3.0)


def test_a_denied_call_never_runs_and_the_model_reads_why(client):
    s = client.open_session()
    asked = ask(s, "t1", f"ship it {GATED_WRITE}")
    s.submit_approvals("t1", [ToolDecision.deny(asked.calls[0], "not on a Friday")])
    final = s.next_event(WAIT, "t1")
    assert isinstance(final, Final), final
    assert not final.result.get("Files"), final.result
    (result,) = final.result["ToolResults"]
    assert "denied" in result["ErrorMessage"] and "not on a Friday" in result["ErrorMessage"], result


def test_a_call_no_rule_gates_runs_without_asking(client):
    s = client.open_session()
    final = s.run_turn("t1", f"note it {FREE_WRITE}", timeout=WAIT, ConversationContextId=GATED)
    assert isinstance(final, Final), final
    assert [f["Name"] for f in final.result["Files"]] == ["run.md"]


def test_run_turn_asks_the_handler(client):
    s = client.open_session()
    asked = []
    final = s.run_turn("t1", f"ship it {GATED_WRITE}", approve=lambda c: asked.append(c.name) or True,
                       timeout=WAIT, ConversationContextId=GATED)
    assert isinstance(final, Final) and asked == ["write_file"], (final, asked)
    assert [f["Name"] for f in final.result["Files"]] == ["run.sh"]


def test_decisions_that_do_not_match_abort_the_turn(client):
    s = client.open_session()
    asked = ask(s, "t1", f"ship it {GATED_WRITE}")
    # The client itself refuses to send decisions that do not name the calls; raw bodies then.
    with pytest.raises(ValueError):
        s.submit_approvals("t1", [ToolDecision.approve("call_not_asked")])
    stale = {"SessionId": s.session_id, "TurnId": "t1",
             "ToolApprovals": [{"ToolCallId": "call_not_asked", "Approved": True}]}
    s.submit(stale)
    refused = s.next_event(WAIT, "t1")
    assert isinstance(refused, Refused) and refused.code == "turn.not_awaiting_approval", refused
    extra = {"SessionId": s.session_id, "TurnId": "t1",
             "ToolApprovals": [{"ToolCallId": asked.calls[0].tool_call_id, "Approved": True},
                               {"ToolCallId": "extra", "Approved": False}]}
    s.submit(extra)
    failed = s.next_event(WAIT, "t1")
    assert isinstance(failed, Failed) and failed.code == "tool_approvals.mismatch", failed


def test_a_message_on_an_approval_is_refused_before_anything_is_stored(client):
    s = client.open_session()
    asked = ask(s, "t1", f"ship it {GATED_WRITE}")
    body = {"SessionId": s.session_id, "TurnId": "t1",
            "ToolApprovals": [{"ToolCallId": asked.calls[0].tool_call_id, "Approved": True, "Message": "ok"}]}
    s.submit(body, validate=False)
    refused = s.next_event(WAIT, "t1")
    assert isinstance(refused, Refused) and refused.code == "validation.tool_approval_invalid", refused
    # The turn still waits: a valid decision goes through.
    s.submit_approvals("t1", [ToolDecision.deny(asked.calls[0])])
    assert isinstance(s.next_event(WAIT, "t1"), Final)


def test_a_waiting_turn_refuses_new_turns_and_can_be_cancelled(client):
    s = client.open_session()
    asked = ask(s, "t1", f"ship it {GATED_WRITE}")
    s.submit_turn("t2", "something else")
    refused = s.next_event(WAIT, "t2")
    assert isinstance(refused, Refused) and refused.code == "session.awaiting_approval", refused
    s.cancel_turn("t1")
    ended = s.next_event(WAIT, "t1")
    assert isinstance(ended, Failed) and ended.code == CODE_TURN_CANCELLED, ended
    s.submit_approvals("t1", [ToolDecision.approve(asked.calls[0])])
    late = s.next_event(WAIT, "t1")
    assert isinstance(late, Refused) and late.code == CODE_TOOL_RESULTS_TURN_CANCELLED, late
    assert isinstance(s.run_turn("t3", "after the cancel", timeout=WAIT), Final)
