//! Approval gates (issue 44; docs/tools.md "Approvals", client protocol §8a) against a real MCP
//! server (tests/mcp/server.py, the official Python SDK) that counts every call it receives: an
//! approved call runs exactly once however often the decisions come, a denied one never runs and
//! the model reads why, an unanswered request expires into denials, decisions that do not match
//! abort the turn, a rule on an argument gates only the calls it matches, and a worker SIGKILLed
//! while an approved call runs does not run it twice.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::mcp_tools::ToolServer;

use std::time::Duration;

use aptix::config::{ApprovalRule, Pattern};
use common::{new_session, user_turn, Harness};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
const OPEN: &str = r#"@call(tickets__open_ticket, {"title":"printer on fire","priority":"high"})"#;

/// A harness whose default context offers the test server's tools, `open_ticket` gated by
/// `rule` (all calls when `None`), requests expiring after `expiry` seconds.
async fn harness(server: &ToolServer, rule: Option<(&str, &str)>, expiry: u32) -> Harness {
    harness_timing(server, rule, expiry, None).await
}

/// [`harness`], with the server's `timeout_ms` when given.
async fn harness_timing(
    server: &ToolServer,
    rule: Option<(&str, &str)>,
    expiry: u32,
    timeout_ms: Option<u64>,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut config = server.config(&token);
    config.timeout_ms = timeout_ms.unwrap_or(config.timeout_ms);
    std::mem::forget(dir); // the token file is read at each connection
    let rule = ApprovalRule {
        tool: "tickets__open_ticket".into(),
        argument: rule.map(|(pointer, _)| pointer.to_owned()),
        matches: rule.map(|(_, m)| Pattern(regex::Regex::new(m).unwrap())),
    };
    Harness::start_with(1, move |s| {
        let name = s.default_conversation_context.clone();
        let tools = &mut s.conversation_contexts.get_mut(&name).unwrap().server_tools;
        tools.mcp.push(config);
        tools.approvals.push(rule);
        tools.approval_expiry_seconds = expiry;
    })
    .await
}

fn approvals(s: &str, turn: &str, decisions: Value) -> Value {
    json!({ "SessionId": s, "TurnId": turn, "ToolApprovals": decisions })
}

/// Submits a turn calling `open_ticket` and returns the approval request's reply body.
async fn asked(h: &Harness, s: &str, turn: &str, call: &str) -> Value {
    h.submit(&user_turn(s, turn, &format!("Open a ticket. {call}"))).await;
    let replies = h.replies(s, 1, WAIT).await;
    let reply = replies.last().unwrap();
    assert_eq!(
        reply.headers.get("x-aptix-outcome").map(String::as_str),
        Some("tool_approval_required")
    );
    assert_eq!(reply.headers.get("x-aptix-final").map(String::as_str), Some("false"));
    let result = reply.body["Result"].clone();
    assert_eq!(result["Kind"], "tool_approval_required", "{result}");
    assert_eq!(result["ToolCalls"][0]["Name"], "tickets__open_ticket", "{result}");
    assert!(result["ApprovalExpiresAt"].as_str().unwrap().ends_with('Z'), "{result}");
    result
}

fn call_id(result: &Value) -> String {
    result["ToolCalls"][0]["ToolCallId"].as_str().unwrap().to_owned()
}

fn tool_results(reply: &Value) -> Vec<Value> {
    reply["Result"]["ToolResults"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approved_call_runs_once_and_a_denied_one_never() {
    let server = ToolServer::start();
    let h = harness(&server, None, 3600).await;
    let s = new_session();

    let result = asked(&h, &s, "t1", OPEN).await;
    assert_eq!(server.count("open_ticket"), 0, "ran before its approval");
    let approve =
        approvals(&s, "t1", json!([{ "ToolCallId": call_id(&result), "Approved": true }]));
    h.submit(&approve).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let last = &replies.last().unwrap().body;
    assert_eq!(last["Result"]["Kind"], "final", "{last}");
    assert!(tool_results(last)[0]["ResultJson"].is_string(), "{last}");
    // The same decisions again (a client that lost its confirm): the call does not run again.
    h.submit(&approve).await;
    let again = h.replies(&s, 1, Duration::from_secs(5)).await;
    assert!(
        again.iter().all(|r| r.body["Result"]["Kind"] == "final"),
        "{:?}",
        again.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(server.count("open_ticket"), 1);

    let result = asked(&h, &s, "t2", OPEN).await;
    let deny = json!([{ "ToolCallId": call_id(&result), "Approved": false, "Message": "not on a Friday" }]);
    h.submit(&approvals(&s, "t2", deny)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let last = &replies.last().unwrap().body;
    let error = tool_results(last)[0]["ErrorMessage"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("the user denied this call: not on a Friday"), "{last}");
    assert_eq!(server.count("open_ticket"), 1, "a denied call ran");
    // The model read the denial as the call's output.
    let sent = h.sim.request_bodies().last().unwrap().to_string();
    assert!(sent.contains("not on a Friday"), "{sent}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unanswered_request_expires_into_denials_and_late_decisions_are_refused() {
    let server = ToolServer::start();
    let h = harness(&server, None, 10).await;
    let s = new_session();
    let result = asked(&h, &s, "t1", OPEN).await;
    let replies = h.replies(&s, 1, Duration::from_secs(40)).await;
    let last = &replies.last().unwrap().body;
    assert_eq!(last["Result"]["Kind"], "final", "{last}");
    let error = tool_results(last)[0]["ErrorMessage"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("expired"), "{last}");
    let late = approvals(&s, "t1", json!([{ "ToolCallId": call_id(&result), "Approved": true }]));
    h.submit(&late).await;
    let refused = h.replies(&s, 1, WAIT).await;
    assert_eq!(
        refused[0].body["Errors"][0]["Code"], "tool_approvals.expired",
        "{}",
        refused[0].body
    );
    assert_eq!(server.count("open_ticket"), 0);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mismatched_decisions_abort_and_a_rule_gates_only_what_it_matches() {
    let server = ToolServer::start();
    let h = harness(&server, Some(("/priority", "^(high|urgent)$")), 3600).await;
    let s = new_session();
    let result = asked(&h, &s, "t1", OPEN).await;
    // Decisions on none of the calls asked about: refused, the request still waits.
    let stale = json!([{ "ToolCallId": "call_never_asked", "Approved": true }]);
    h.submit(&approvals(&s, "t1", stale)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(
        replies[0].body["Errors"][0]["Code"], "turn.not_awaiting_approval",
        "{}",
        replies[0].body
    );
    // One more decision than calls: the turn is aborted.
    let id = call_id(&result);
    let wrong = json!([{ "ToolCallId": id, "Approved": true }, { "ToolCallId": "extra", "Approved": true }]);
    h.submit(&approvals(&s, "t1", wrong)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(
        replies[0].body["Errors"][0]["Code"], "tool_approvals.mismatch",
        "{}",
        replies[0].body
    );
    assert_eq!(server.count("open_ticket"), 0);

    // Low priority: no rule matches, the call runs without asking.
    let low = r#"@call(tickets__open_ticket, {"title":"paper jam","priority":"low"})"#;
    h.submit(&user_turn(&s, "t2", low)).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(replies[0].body["Result"]["Kind"], "final", "{}", replies[0].body);
    assert_eq!(server.count("open_ticket"), 1);
    h.teardown().await;
}

/// A cancel while approved calls run: the one running finishes, the others never start, and
/// the turn ends cancelled (docs/tools.md "Effects"). Each call takes 8 s, so the cancel is
/// marked long before the first ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_stops_approved_calls_not_yet_started() {
    let server = ToolServer::start();
    let h = harness_timing(&server, None, 3600, Some(20_000)).await;
    let s = new_session();
    let calls: String = ["a", "b", "c"]
        .iter()
        .map(|t| format!(r#" @call(tickets__open_ticket, {{"title":"{t}","delay_seconds":8}})"#))
        .collect();
    let result = asked(&h, &s, "t1", &calls).await;
    let asked_for = result["ToolCalls"].as_array().unwrap();
    assert_eq!(asked_for.len(), 3, "{result}");
    let all: Vec<Value> = asked_for
        .iter()
        .map(|c| json!({ "ToolCallId": c["ToolCallId"], "Approved": true }))
        .collect();
    h.submit(&approvals(&s, "t1", Value::Array(all))).await;
    server.wait_for("open_ticket").await;
    h.cancel(&s, "t1").await;
    // The turn's one reply comes after its calls: had the others run, they would have by now.
    let replies = h.replies(&s, 1, WAIT).await;
    let last = &replies.last().unwrap().body;
    assert_eq!(last["Errors"][0]["Code"], "turn.cancelled", "{last}");
    assert_eq!(server.count("open_ticket"), 1, "calls started after the cancel");
    h.teardown().await;
}

/// A worker SIGKILLed while an approved (not idempotent) call runs, then restarted: the call
/// is not run again, and the turn ends with one reply; the server counts one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approved_call_cut_short_by_sigkill_runs_at_most_once() {
    let server = ToolServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aptix.toml");
    std::fs::write(
        &config,
        format!(
            "[[conversation_contexts.default.server_tools.mcp]]\nname = \"tickets\"\nurl = \"{}\"\n\
             allowed_tools = [\"open_ticket\"]\ntimeout_ms = 8000\n\n\
             [[conversation_contexts.default.server_tools.approvals]]\ntool = \"tickets__open_ticket\"\n",
            server.url
        ),
    )
    .unwrap();
    let h = Harness::start(0).await;
    let spawn = || crate::mcp_tools::worker(&h, &config);
    let mut worker = spawn();
    let s = new_session();
    let slow = r#"@call(tickets__open_ticket, {"title":"once","delay_seconds":5})"#;
    let result = asked(&h, &s, "t1", slow).await;
    h.submit(&approvals(&s, "t1", json!([{ "ToolCallId": call_id(&result), "Approved": true }])))
        .await;
    server.wait_for("open_ticket").await;
    worker.kill().unwrap(); // SIGKILL, while the approved call runs
    worker.wait().unwrap();
    let mut worker = spawn();
    let replies = h.replies(&s, 1, Duration::from_secs(90)).await;
    assert_eq!(replies.len(), 1, "{:?}", replies.iter().map(|r| &r.body).collect::<Vec<_>>());
    assert_eq!(replies[0].body["Result"]["Kind"], "final", "{}", replies[0].body);
    common::terminate(&mut worker);
    assert_eq!(server.count("open_ticket"), 1, "the approved call ran twice");
    h.teardown().await;
}

/// A waiting turn whose calls cannot be denied (its stored reply address unusable) is put an
/// hour ahead: the expiry pass reads the earliest expiries first, 50 at a time, and such turns
/// would otherwise come first on every pass and hold back every other tenant's expiries.
#[tokio::test]
async fn an_expiry_that_cannot_be_applied_makes_way_for_the_next() {
    use crate::store_support::{drop_database, fresh_store};
    let (store, db) = fresh_store().await;
    let session = park_unexpirable(&store, None, "1 minute").await;
    let started = store.expire_approvals().await.unwrap();
    assert!(started.messages.is_empty(), "nothing could be started");
    assert!(put_ahead(&store, session).await, "out of the way of the next passes");
    drop_database(store, &db).await;
}

/// A tenant that parks more gated turns than a pass decides (50) delays its own expiries, not
/// another tenant's: a pass takes each tenant's earliest in turn. Every expiry here fails (an
/// unusable reply address), so each turn a pass took is put an hour ahead.
#[tokio::test]
async fn one_tenants_expiries_do_not_hold_back_anothers() {
    use crate::store_support::{drop_database, fresh_store};
    let (store, db) = fresh_store().await;
    for _ in 0..60 {
        park_unexpirable(&store, Some("greedy"), "10 minutes").await;
    }
    let other = park_unexpirable(&store, Some("other"), "1 minute").await;
    store.expire_approvals().await.unwrap();
    assert!(put_ahead(&store, other).await, "the first pass took the other tenant's expiry");
    drop_database(store, &db).await;
}

/// A turn of `tenant` awaiting approval since `ago` whose expiry cannot be applied (its reply
/// address unusable); its session.
async fn park_unexpirable(
    store: &aptix::store::Store,
    tenant: Option<&str>,
    ago: &str,
) -> uuid::Uuid {
    use aptix::contracts::{SessionId, TurnKey};
    let session = uuid::Uuid::now_v7();
    let key = TurnKey { session_id: SessionId::new(session), turn_id: "t0".parse().unwrap() };
    let request = json!({"SessionId": session, "TurnId": "t0", "Instruction": "hello"});
    let meta = aptix::store::SessionMeta::default();
    store.admit_user_turn(&key, "fp", &request, &meta, None).await.unwrap();
    sqlx::query(
        "UPDATE turns SET state = 'awaiting_approval', reply_to = 'Not A Name!',
                          tenant = $2, approval_expires_at = now() - $3::interval
         WHERE session_id = $1",
    )
    .bind(session)
    .bind(tenant)
    .bind(ago)
    .execute(store.pool())
    .await
    .unwrap();
    session
}

/// Whether an expiry pass took `session`'s turn and, failing to apply it, put it an hour ahead.
async fn put_ahead(store: &aptix::store::Store, session: uuid::Uuid) -> bool {
    sqlx::query_scalar(
        "SELECT approval_expires_at > now() + interval '50 minutes' FROM turns WHERE session_id = $1",
    )
    .bind(session)
    .fetch_one(store.pool())
    .await
    .unwrap()
}
