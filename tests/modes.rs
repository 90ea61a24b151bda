//! A mode per turn (docs/client-protocol.md §7c): one session moves between two
//! ConversationContexts through the real pipeline; each turn's request carries its own mode,
//! a continued chain gets the new boot prompt once as a developer message, a turn naming none
//! stays in the session's current mode, and each record names the mode it ran in.

use std::time::Duration;

use serde_json::{json, Value};

use crate::assemble_support::write_request_body;
use crate::common::{new_session, user_turn, Harness};
use aptix::config::content_version;

const WAIT: Duration = Duration::from_secs(60);

fn texts(item: &Value) -> String {
    let parts = item["content"].as_array().cloned().unwrap_or_default();
    parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_changes_mode_per_turn_and_the_chain_hears_of_it_once() {
    let mut h = Harness::start_with(0, |s| {
        let mut refine = s.conversation_contexts[&s.default_conversation_context].clone();
        refine.mode = "DDR_REFINEMENT".into();
        refine.system_prompt = "You refine an existing DDR. Change only what is asked.".into();
        s.conversation_contexts.insert("refine".into(), refine);
    })
    .await;
    h.run(1);
    let s = new_session();
    let default_mode = h.settings.conversation_context(None).unwrap().mode.clone();
    let mut second = user_turn(&s, "t2", "tighten the retry section");
    second["ConversationContextId"] = json!("refine");
    let turns =
        [user_turn(&s, "t1", "draft the DDR"), second, user_turn(&s, "t3", "and the summary")];
    for (n, turn) in turns.iter().enumerate() {
        h.submit(turn).await;
        let replies = h.replies(&s, n + 1, WAIT).await;
        assert_eq!(replies.last().unwrap().headers["x-aptix-outcome"], "final", "turn {}", n + 1);
    }
    let bodies: Vec<Value> = h.sim.request_bodies();
    assert_eq!(bodies.len(), 3);
    for (i, body) in bodies.iter().enumerate() {
        write_request_body(&format!("pipeline-mode-change-{}", i + 1), body);
    }
    let input = |i: usize| bodies[i]["input"].as_array().cloned().unwrap();
    // t1: a new chain in the default mode.
    assert_eq!(input(0)[0]["role"], "system");
    assert!(texts(input(0).last().unwrap()).starts_with(&format!("[MODE: {default_mode}]")));
    // t2: the chain goes on; the new mode's prompt comes once, as a developer message.
    assert!(bodies[1]["previous_response_id"].is_string());
    assert_eq!(input(1)[0]["role"], "developer", "{}", bodies[1]);
    assert!(texts(&input(1)[0]).contains("You refine an existing DDR."));
    assert!(texts(input(1).last().unwrap()).starts_with("[MODE: DDR_REFINEMENT]"));
    // t3 names no mode: the session's current one, and no prompt again.
    assert!(input(2).iter().all(|i| i["role"] != "developer"), "{}", bodies[2]);
    assert!(texts(input(2).last().unwrap()).starts_with("[MODE: DDR_REFINEMENT]"));
    // Each record names the mode it ran in.
    let modes: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT turn_id, conversation_context_id FROM response_records
         WHERE session_id = $1::uuid ORDER BY turn_id",
    )
    .bind(&s)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    let default_id = h.settings.default_conversation_context.clone();
    let want = [("t1", default_id.as_str()), ("t2", "refine"), ("t3", "refine")];
    let got: Vec<(&str, &str)> =
        modes.iter().map(|(t, m)| (t.as_str(), m.as_deref().unwrap_or("-"))).collect();
    assert_eq!(got, want);
    // And the versions of its contexts: the digest of each one's content.
    let versions: Vec<Value> = sqlx::query_scalar(
        "SELECT context_versions FROM response_records WHERE session_id = $1::uuid ORDER BY turn_id",
    )
    .bind(&s)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    let version = |id: &str| content_version(&h.settings.conversation_contexts[id]);
    let agent = &h.settings.default_agent_context;
    for (v, (_, mode)) in versions.iter().zip(want) {
        assert_eq!(v["ConversationContext"], json!({"Id": mode, "Version": version(mode)}));
        let agent_version = content_version(&h.settings.agent_contexts[agent]);
        assert_eq!(v["AgentContext"], json!({"Id": agent, "Version": agent_version}));
    }
    assert_ne!(version(&default_id), version("refine"), "two contexts, two versions");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_turn_changes_no_mode() {
    let mut h = Harness::start_with(0, |s| {
        let mut refine = s.conversation_contexts[&s.default_conversation_context].clone();
        refine.mode = "DDR_REFINEMENT".into();
        s.conversation_contexts.insert("refine".into(), refine);
    })
    .await;
    h.run(1);
    let s = new_session();
    // t1 waits for tool results; t2, naming another mode meanwhile, is refused.
    h.submit(&user_turn(&s, "t1", "@call(run_tests) what is in the sample repo?")).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(got.last().unwrap().headers["x-aptix-outcome"], "client_tool_continuation");
    let mut t2 = user_turn(&s, "t2", "switch modes");
    t2["ConversationContextId"] = json!("refine");
    h.submit(&t2).await;
    let got = h.replies(&s, 1, WAIT).await;
    let code = &got.last().unwrap().body["Errors"][0]["Code"];
    assert_eq!(code, "session.awaiting_tool_results", "{got:?}");
    let mode = h.session_mode(&s).await;
    assert_eq!(mode.as_deref(), Some(h.settings.default_conversation_context.as_str()));
    // A turn that ends without an answer (here cancelled) keeps its mode in its record too.
    h.cancel(&s, "t1").await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(got.last().unwrap().body["Errors"][0]["Code"], "turn.cancelled", "{got:?}");
    let recorded: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT kind, conversation_context_id FROM response_records
         WHERE session_id = $1::uuid AND turn_id = 't1' ORDER BY step",
    )
    .bind(&s)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    let default_id = Some(h.settings.default_conversation_context.clone());
    let cancelled = recorded.iter().find(|(kind, _)| kind == "cancelled");
    assert_eq!(cancelled.map(|(_, m)| m.clone()), Some(default_id), "{recorded:?}");
    h.teardown().await;
}
