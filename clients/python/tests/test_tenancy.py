"""Tenants against the REAL pipeline: two tenants A and B, each a RabbitMQ user with only its own
tenant's permissions (configure and read `^P\\.(session|instance)\\.T\\..*`, write `^P\\.requests$`).

A turn of A ends on A's own queue `<prefix>.session.<A>.<SessionId>`; B, naming A's SessionId
(a user turn, a duplicate of A's turn, tool results for A's waiting turn), is refused with
`session.unavailable` on B's own queue `<prefix>.session.<B>.<SessionId>` while A's queue gets
nothing; B can neither declare nor consume A's queues (403) nor publish as A's user (406); a
session changes its ConversationContextId (its mode) per turn, while a later turn naming another
AgentContextId is refused with `session.context_fixed`; a tenant's instance queue is
`<prefix>.instance.<A>.<I>`; a turn in a ConversationContext whose money budget is spent fails with
`limit.budget_exhausted` (one of `LIMIT_CODES`), and the session goes on.

Skipped unless `APTIX_TEST_TENANTS` is set. `CLIENTS_TENANTS=1 clients/run-tests.sh PATH/TO/aptix`
configures the tenants and sets `APTIX_TEST_TENANT_A_URL` / `APTIX_TEST_TENANT_B_URL` (their
broker URLs), `APTIX_TEST_TENANT_A` / `APTIX_TEST_TENANT_B` (their names) and
`APTIX_TEST_OTHER_CONVERSATION_CONTEXT` (a second ConversationContext tenant A may use, default
`other`; its first, the one a session is created with here, is `default`) and
`APTIX_TEST_SPENT_CONVERSATION_CONTEXT` (one whose budget any call would pass, default `spent`).
"""

import os
import uuid
from dataclasses import dataclass
from typing import Callable

import pika
import pika.exceptions
import pytest

from aptix_client import (CODE_CONTEXT_FIXED, CODE_SESSION_UNAVAILABLE, LIMIT_CODES, Client, EventTimeout,
                          Failed, Final, Refused, ToolCalls, ToolResult, instance_queue, session_queue, url_user)
from conftest import queue_exists

WAIT = 90.0
#: The ConversationContext tenant A's sessions are created with here (the first of its list).
FIRST_CONTEXT = "default"

pytestmark = pytest.mark.skipif(not os.environ.get("APTIX_TEST_TENANTS"),
                                reason="no tenants: run CLIENTS_TENANTS=1 clients/run-tests.sh")


@dataclass(frozen=True)
class Tenants:
    """The pipeline's prefix, the two tenants' names and broker URLs, and an admin URL."""

    prefix: str
    a: str
    b: str
    a_url: str
    b_url: str
    admin_url: str
    other_context: str
    spent_context: str


@pytest.fixture(scope="module")
def tenants(pipeline, admin_url) -> Tenants:
    names = ("APTIX_TEST_TENANT_A", "APTIX_TEST_TENANT_B", "APTIX_TEST_TENANT_A_URL",
             "APTIX_TEST_TENANT_B_URL")
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        pytest.fail(f"APTIX_TEST_TENANTS is set but {', '.join(missing)} is not")
    env = os.environ
    return Tenants(pipeline.prefix, env["APTIX_TEST_TENANT_A"], env["APTIX_TEST_TENANT_B"],
                   env["APTIX_TEST_TENANT_A_URL"], env["APTIX_TEST_TENANT_B_URL"], admin_url,
                   env.get("APTIX_TEST_OTHER_CONVERSATION_CONTEXT") or "other",
                   env.get("APTIX_TEST_SPENT_CONVERSATION_CONTEXT") or "spent")


@pytest.fixture
def a(tenants, schemas):
    """A client of tenant A, per session."""
    with Client(tenants.a_url, tenants.prefix, tenant=tenants.a, schemas=schemas, strict=True) as c:
        yield c


@pytest.fixture
def b(tenants, schemas):
    """A client of tenant B, per session."""
    with Client(tenants.b_url, tenants.prefix, tenant=tenants.b, schemas=schemas, strict=True) as c:
        yield c



def closed_with(code: int, action: Callable[[], object]) -> None:
    """`action` makes the broker close its channel with `code` (403 ACCESS_REFUSED, 406 ...)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        action()
    assert e.value.reply_code == code, e.value


def assert_refused(reply: object, code: str, message_id: str, session_id: str) -> Refused:
    """`reply` is the refusal, with `code`, of the submission `message_id` of `session_id`."""
    assert isinstance(reply, Refused), reply
    assert reply.code == code, reply.errors
    assert reply.outcome == "refused" and reply.final
    assert reply.correlation_id == message_id and reply.session_id == session_id, reply
    return reply


def test_a_tenant_turn_ends_on_its_own_session_queue(a, tenants):
    s = a.open_session()
    assert s.queue == session_queue(tenants.prefix, s.session_id, tenants.a) \
        == f"{tenants.prefix}.session.{tenants.a}.{s.session_id}"
    s.submit_turn("t1", "hello from tenant a")
    reply = s.next_event(WAIT, "t1")
    assert isinstance(reply, Final), reply
    assert reply.message_id == f"reply:{s.session_id}:t1:step-0" and reply.step == 0
    assert "instruction: hello from tenant a" in reply.text.splitlines(), reply.text
    with pytest.raises(EventTimeout):
        s.next_event(1.0)
    assert queue_exists(tenants.admin_url, s.queue)
    assert not queue_exists(tenants.admin_url, session_queue(tenants.prefix, s.session_id)), \
        "a tenant's session has no queue without the tenant's name"


def test_another_tenant_is_refused_the_session_on_its_own_queue(a, b, tenants):
    on_a = a.open_session()
    on_a.submit_turn("t1", "tools @call(run_tests)")
    calls = on_a.next_event(WAIT, "t1")
    assert isinstance(calls, ToolCalls), calls  # A's turn waits for tool results

    on_b = b.open_session(on_a.session_id)
    assert on_b.queue == f"{tenants.prefix}.session.{tenants.b}.{on_a.session_id}"
    sid = on_a.session_id

    # Tool results that A's waiting turn would accept, from B.
    sub = on_b.submit_tool_results("t1", [ToolResult.error(c, "not yours", 1) for c in calls.calls])
    assert_refused(on_b.next_event(WAIT), CODE_SESSION_UNAVAILABLE, sub.message_id, sid)

    on_a.submit_tool_results("t1", [ToolResult.error(c, "no tests matched", 2) for c in calls.calls])
    final = on_a.next_event(WAIT, "t1")
    assert isinstance(final, Final) and final.step == 1, final

    # A duplicate of A's finished turn (it would get A's stored reply), and a new user turn.
    sub = on_b.submit_turn("t1", "tools @call(run_tests)")
    assert_refused(on_b.next_event(WAIT), CODE_SESSION_UNAVAILABLE, sub.message_id, sid)
    sub = on_b.submit_turn("t2", "a turn in someone else's session")
    assert_refused(on_b.next_event(WAIT), CODE_SESSION_UNAVAILABLE, sub.message_id, sid)
    with pytest.raises(EventTimeout):
        on_b.next_event(1.0)

    with pytest.raises(EventTimeout):
        on_a.next_event(2.0)  # A's queue got nothing of B's
    assert on_a.duplicates_dropped == 0
    # B's refused t2 left nothing behind: A's own t2 (other content) starts.
    again = on_a.run_turn("t2", "a's own second turn", timeout=WAIT)
    assert isinstance(again, Final) and again.message_id == f"reply:{sid}:t2:step-0", again


def test_another_tenant_can_neither_reach_the_queues_nor_publish_as_its_user(a, tenants):
    s = a.open_session()  # A's queue exists
    conn = pika.BlockingConnection(pika.URLParameters(tenants.b_url))
    try:
        closed_with(403, lambda: conn.channel().queue_declare(s.queue, durable=True, arguments={}))
        closed_with(403, lambda: conn.channel().basic_consume(s.queue, lambda *_: None, auto_ack=False))
        closed_with(403, lambda: conn.channel().queue_declare(
            instance_queue(tenants.prefix, "pod-1", tenants.a), durable=True, arguments={}))
        closed_with(403, lambda: conn.channel().queue_declare(
            session_queue(tenants.prefix, s.session_id), durable=True, arguments={}))

        def publish_as_a() -> None:
            ch = conn.channel()
            ch.confirm_delivery()
            body = b'{"SessionId": "%s", "TurnId": "t1", "Instruction": "x"}' % s.session_id.encode()
            ch.basic_publish(f"{tenants.prefix}.requests", s.session_id, body, pika.BasicProperties(
                content_type="application/json", delivery_mode=2, message_id=str(uuid.uuid4()),
                user_id=url_user(tenants.a_url)), mandatory=True)

        closed_with(406, publish_as_a)  # the broker checks user_id against the connection's user
    finally:
        if conn.is_open:
            conn.close()

    # Through the client: B's user naming tenant A declares A's queue, and is refused.
    with Client(tenants.b_url, tenants.prefix, tenant=tenants.a) as c:
        closed_with(403, lambda: c.open_session(s.session_id))
    with pytest.raises(EventTimeout):
        s.next_event(1.0)


def test_a_session_changes_its_mode_per_turn_and_keeps_its_agent_context(a, tenants):
    other = tenants.other_context
    s = a.open_session()
    first = s.run_turn("t1", "first", ConversationContextId=FIRST_CONTEXT, timeout=WAIT)
    assert isinstance(first, Final), first
    # The mode is the turn's: another ConversationContext of the tenant's, then none (the
    # session's current one), then back.
    for n, fields in enumerate([{"ConversationContextId": other}, {}, {"ConversationContextId": FIRST_CONTEXT}], 2):
        turn = s.run_turn(f"t{n}", f"turn {n}", timeout=WAIT, **fields)
        assert isinstance(turn, Final) and turn.message_id == f"reply:{s.session_id}:t{n}:step-0", turn
    # The AgentContext (endpoint, key, collection) is the session's for good.
    # Another of the tenant's own agent contexts (one it may not use is simply unknown).
    other_agent = os.environ.get("APTIX_TEST_OTHER_AGENT_CONTEXT", "alt")
    sub = s.submit_turn("t5", "elsewhere", AgentContextId=other_agent)
    reply = assert_refused(s.next_event(WAIT, "t5"), CODE_CONTEXT_FIXED, sub.message_id, s.session_id)
    assert reply.turn_id == "t5"
    # A refusal changes nothing: the session goes on.
    sixth = s.run_turn("t6", "sixth", timeout=WAIT)
    assert isinstance(sixth, Final) and sixth.message_id == f"reply:{s.session_id}:t6:step-0", sixth


def test_a_turn_over_a_spent_budget_fails_with_a_limit_code(a, tenants):
    s = a.open_session()
    reply = s.run_turn("t1", "spend", ConversationContextId=tenants.spent_context, timeout=WAIT)
    assert isinstance(reply, Failed), reply
    assert reply.code == "limit.budget_exhausted" and reply.code in LIMIT_CODES, reply.errors
    assert f"ConversationContext {tenants.spent_context}" in reply.errors[0].message, reply.errors
    assert reply.message_id == f"reply:{s.session_id}:t1:step-0" and reply.final, reply
    # Only that call was not made: the session's next turn, in its own mode, runs.
    again = s.run_turn("t2", "within budget", ConversationContextId=FIRST_CONTEXT, timeout=WAIT)
    assert isinstance(again, Final), again


def test_a_tenant_instance_queue(tenants, schemas):
    name = f"py-{uuid.uuid4().hex[:12]}"
    with Client(tenants.a_url, tenants.prefix, tenant=tenants.a, instance=name, schemas=schemas) as c:
        assert c.instance is not None
        try:
            assert c.instance.queue == instance_queue(tenants.prefix, name, tenants.a) \
                == f"{tenants.prefix}.instance.{tenants.a}.{name}"
            s = c.open_session()
            sub = s.submit_turn("t1", "hello from an instance of tenant a")
            assert sub.reply_to == s.reply_to == c.instance.queue
            reply = s.next_event(WAIT, "t1")
            assert isinstance(reply, Final) and reply.session_id == s.session_id, reply
            assert "instruction: hello from an instance of tenant a" in reply.text.splitlines(), reply.text
            for queue in (session_queue(tenants.prefix, s.session_id, tenants.a),
                          session_queue(tenants.prefix, s.session_id)):
                assert not queue_exists(tenants.admin_url, queue), f"{queue} was created"
        finally:
            c.instance.delete_queue()
