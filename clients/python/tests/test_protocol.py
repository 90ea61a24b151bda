"""The message_id grammar and the header checks of protocol v3, without a broker."""

import pytest

from aptix_client import (CANCEL_TYPE, CODE_CONTEXT_FIXED, CODE_REPLY_TO_INVALID, CODE_SESSION_UNAVAILABLE,
                          CODE_TOOL_RESULTS_TURN_CANCELLED, CODE_TURN_CANCELLED, CODE_TURN_FINISHED,
                          CODE_TURN_NOT_FOUND, LIMIT_CODES, DeltaId, ProtocolError, ReplyId, instance_queue,
                          is_instance_name, is_tenant_name, parse_message_id)
from aptix_client.protocol import (SUBMISSION_TAGS, check_reply_headers, message_session_id,
                                   requests_exchange, session_queue)

S = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f"
HEX = "0123456789abcdef01234567"


def test_names():
    assert requests_exchange("aptix") == "aptix.requests"
    assert session_queue("t-1", S) == f"t-1.session.{S}"


def test_instance_names():
    assert instance_queue("aptix", "pod-1") == "aptix.instance.pod-1"
    assert CODE_REPLY_TO_INVALID == "request.reply_to_invalid"
    for good in ["a", "pod-1", "host.example_2", "A" * 64, "..", "-_."]:
        assert is_instance_name(good), good
    for bad in ["", "A" * 65, "a b", "a/b", "a:b", "pod*", "é", "a\n", "\na", "pod-1\n"]:
        assert not is_instance_name(bad), bad


GOOD_TENANTS = ["a", "0", "t1", "acme-corp", "team_7", "a" * 32, "9-_"]
BAD_TENANTS = ["", "A", "Acme", "-a", "_a", "a" * 33, "a.b", "a b", "a/b", "é", "t1\n", "\nt1", "a:b"]


def test_tenant_names():
    for good in GOOD_TENANTS:
        assert is_tenant_name(good), good
    for bad in BAD_TENANTS:
        assert not is_tenant_name(bad), bad


def test_reply_queues_of_a_tenant():
    assert session_queue("aptix", S, "t1") == f"aptix.session.t1.{S}"
    assert session_queue("aptix", S, None) == session_queue("aptix", S) == f"aptix.session.{S}"
    assert instance_queue("aptix", "pod-1", "acme-corp") == "aptix.instance.acme-corp.pod-1"
    assert instance_queue("aptix", "pod-1", None) == "aptix.instance.pod-1"
    for bad in ["", "T1", "a.b", "a" * 33]:
        with pytest.raises(ValueError, match="tenant name"):
            session_queue("aptix", S, bad)
        with pytest.raises(ValueError, match="tenant name"):
            instance_queue("aptix", "pod-1", bad)


def test_tenancy_error_codes():
    assert (CODE_SESSION_UNAVAILABLE, CODE_CONTEXT_FIXED) == ("session.unavailable", "session.context_fixed")
    assert LIMIT_CODES == ("limit.turns_in_flight", "limit.turns_per_minute", "limit.sessions_per_minute",
                           "limit.tokens_per_minute", "limit.budget_exhausted")


def test_cancel_type_and_codes():
    assert CANCEL_TYPE == "turn.cancel"
    codes = (CODE_TURN_CANCELLED, CODE_TURN_FINISHED, CODE_TURN_NOT_FOUND, CODE_TOOL_RESULTS_TURN_CANCELLED)
    assert codes == ("turn.cancelled", "turn.finished", "turn.not_found", "tool_results.turn_cancelled")


def test_the_session_of_a_message_on_an_instance_queue():
    import json
    delta = json.dumps({"Delta": True, "SessionId": S, "TurnId": "t1"}).encode()
    reply = json.dumps({"Successful": True, "Result": {"SessionId": S, "Kind": "final"}}).encode()
    refusal = json.dumps({"Successful": False, "Result": None, "Errors": []}).encode()
    other = "00000000-0000-4000-8000-000000000000"
    assert message_session_id({"x-aptix-session-id": other}, delta) == other  # the header decides
    assert message_session_id({}, delta) == S
    assert message_session_id(None, reply) == S
    assert message_session_id({"x-aptix-session-id": ""}, refusal) is None
    assert message_session_id({"x-aptix-session-id": 7}, b"not json") is None
    assert message_session_id({}, b"[1, 2]") is None


def test_step_replies_and_turn_ids_with_colons():
    assert parse_message_id(f"reply:{S}:t1:step-0") == ReplyId(S, "t1", 0, None, None)
    assert parse_message_id(f"reply:{S}:a:b.c:step-12") == ReplyId(S, "a:b.c", 12, None, None)


TAGS = ["rejected", "rejected-context", "rejected-awaiting", "rejected-continuation", "conflict", "resent",
        "exhausted", "unavailable", "limited", "rejected-cancel", "rejected-busy", "rejected-follow-up", "rejected-resume"]


def test_the_submission_tags_of_the_grammar():
    assert sorted(SUBMISSION_TAGS) == sorted(TAGS)


@pytest.mark.parametrize("tag", TAGS)
def test_submission_replies(tag):
    assert parse_message_id(f"reply:{S}:t1:{tag}-{HEX}") == ReplyId(S, "t1", None, tag, HEX)


def test_refusal_without_a_turn():
    assert parse_message_id(f"reply:{S}:-:rejected-{HEX}") == ReplyId(S, None, None, "rejected", HEX)


def test_delta_ids():
    assert parse_message_id(f"delta:{S}:t1:1:42") == DeltaId(S, "t1", 1, 42)
    assert parse_message_id(f"delta:{S}:x:y:0:3") == DeltaId(S, "x:y", 0, 3)


@pytest.mark.parametrize("bad", [
    "", "r1", f"reply:{S}:t1", f"reply:{S}:t1:step-x", f"reply:{S}:t1:conflict-123",
    "reply:not-a-uuid:t1:step-0", f"reply:{S}:-:step-0", f"reply:{S}:t 1:step-0",
    f"delta:{S}:t1:0", f"delta:{S}:t1:a:1", f"reply:{S}:t1:unknown-{HEX}",
])
def test_malformed_ids(bad):
    with pytest.raises(ValueError):
        parse_message_id(bad)


def reply_headers(**over):
    h = {"x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "reply",
         "x-aptix-final": True, "x-aptix-step": 0, "x-aptix-outcome": "final"}
    h.update(over)
    return {k: v for k, v in h.items() if v is not None}


def test_good_headers_pass():
    check_reply_headers("reply", f"reply:{S}:t1:step-0", reply_headers())
    check_reply_headers("delta", f"delta:{S}:t1:0:3", {
        "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta",
        "x-aptix-step": 0, "x-aptix-seq": 3})


@pytest.mark.parametrize("over, needle", [
    ({"x-aptix-final": "true"}, "x-aptix-final"),            # a string, not an AMQP boolean
    ({"x-aptix-step": "0"}, "x-aptix-step"),
    ({"x-aptix-step": True}, "x-aptix-step"),                # a boolean is not an integer
    ({"x-aptix-outcome": None}, "x-aptix-outcome"),
    ({"x-aptix-outcome": "done"}, "x-aptix-outcome"),
    ({"x-aptix-protocol": "2"}, "x-aptix-protocol"),         # a string, not an AMQP integer
    ({"x-aptix-kind": "delta"}, "differs"),
    ({"x-aptix-session-id": "5f0c6f7e-8a1b-4c2d-9e3f-000000000000"}, "another session"),
])
def test_bad_headers_are_named(over, needle):
    with pytest.raises(ProtocolError, match=needle):
        check_reply_headers("reply", f"reply:{S}:t1:step-0", reply_headers(**over))


def test_delta_seq_must_be_an_integer():
    with pytest.raises(ProtocolError, match="x-aptix-seq"):
        check_reply_headers("delta", f"delta:{S}:t1:0:10", {
            "x-aptix-session-id": S, "x-aptix-turn-id": "t1", "x-aptix-kind": "delta",
            "x-aptix-step": 0, "x-aptix-seq": "10"})


def test_a_delta_id_on_a_reply_is_refused():
    with pytest.raises(ProtocolError, match="does not fit"):
        check_reply_headers("reply", f"delta:{S}:t1:0:1", reply_headers())
