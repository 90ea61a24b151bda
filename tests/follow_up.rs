//! What a user turn does when its session is busy, by its mode's `follow_up`
//! (docs/client-protocol.md §11, "Follow-ups"): `interrupt` cancels the running turn (which
//! ends as cancelled, keeping what it streamed) and runs next; `reject` is refused with
//! `session.busy`, and the running turn goes on untouched. A request's `FollowUp` chooses among
//! the policies its mode's `follow_up_allowed` lists; another is refused and nothing is stored.

use std::time::Duration;

use serde_json::json;

use crate::common::{new_session, user_turn, Harness, ReplyMsg};
use aptix::config::FollowUp;
use aptix::sim::Latency;

const WAIT: Duration = Duration::from_secs(60);

fn long_instruction() -> String {
    let words = "explain send_invoice_email and every retry path in detail ";
    format!("Stream a long answer. {}", words.repeat(30))
}

fn ends(replies: &[ReplyMsg]) -> Vec<(String, String)> {
    let code = |r: &ReplyMsg| r.body["Errors"][0]["Code"].as_str().unwrap_or("-").to_owned();
    replies
        .iter()
        .filter(|r| r.is_final && r.body.get("Delta").is_none())
        .map(|r| (r.turn_id.clone(), format!("{}/{}", r.headers["x-aptix-outcome"], code(r))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_interrupts_or_is_rejected_as_its_mode_says() {
    let mut h = Harness::start_with(0, |s| {
        let default = s.default_conversation_context.clone();
        let mut strict = s.conversation_contexts[&default].clone();
        strict.follow_up = FollowUp::Reject;
        s.conversation_contexts.insert("strict".into(), strict.clone());
        strict.follow_up = FollowUp::Enqueue;
        strict.follow_up_allowed = vec![FollowUp::Reject];
        s.conversation_contexts.insert("narrow".into(), strict);
        let own = s.conversation_contexts.get_mut(&default).unwrap();
        own.follow_up = FollowUp::Interrupt;
        // A request may choose nothing in the default mode: a turn that names no mode in a
        // session of another mode is judged by that mode's list, not this one.
        own.follow_up_allowed = vec![];
    })
    .await;
    h.run(1);
    h.sim.set_latency(Latency { fixed_ms: 0, jitter_ms: 0, per_event_ms: 60 });

    // Interrupt: t2 cancels the streaming t1, which ends as cancelled; t2 then runs.
    let s = new_session();
    let mut t1 = user_turn(&s, "t1", &long_instruction());
    t1["Stream"] = json!(true);
    h.submit(&t1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    h.submit(&user_turn(&s, "t2", "never mind, do this instead")).await;
    let got = h.replies(&s, 2, WAIT).await;
    assert_eq!(
        ends(&got),
        [("t1".into(), "failed/turn.cancelled".into()), ("t2".into(), "final/-".into())],
        "{got:?}"
    );
    assert_eq!(h.sim.stats().streams_abandoned, 1, "t1's provider stream was closed");

    // Reject: t2 is refused while t1 runs, and t1 ends as it would have.
    let s = new_session();
    let mut t1 = user_turn(&s, "t1", "a short answer");
    t1["ConversationContextId"] = json!("strict");
    h.sim.set_latency(Latency { fixed_ms: 1500, jitter_ms: 0, per_event_ms: 0 });
    h.submit(&t1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.submit(&user_turn(&s, "t2", "are you done?")).await;
    let got = h.replies(&s, 2, WAIT).await;
    assert_eq!(
        ends(&got),
        [("t2".into(), "refused/session.busy".into()), ("t1".into(), "final/-".into())],
        "{got:?}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE session_id = $1::uuid")
        .bind(&s)
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 1, "nothing stored for the rejected turn");

    // Per request, within what the mode allows: `narrow` enqueues by default and lets a request
    // choose only `reject`.
    let s = new_session();
    let in_narrow = |turn: &str, text: &str, follow_up: Option<&str>| {
        let mut t = user_turn(&s, turn, text);
        t["ConversationContextId"] = json!("narrow");
        if let Some(f) = follow_up {
            t["FollowUp"] = json!(f);
        }
        t
    };
    h.submit(&in_narrow("t1", "a short answer", None)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.submit(&in_narrow("t2", "stop it", Some("interrupt"))).await;
    h.submit(&in_narrow("t3", "are you done?", Some("reject"))).await;
    h.submit(&in_narrow("t4", "then this", None)).await;
    let got = h.replies(&s, 4, WAIT).await;
    assert_eq!(
        ends(&got),
        [
            ("t2".into(), "refused/context.follow_up_not_allowed".into()),
            ("t3".into(), "refused/session.busy".into()),
            ("t1".into(), "final/-".into()),
            ("t4".into(), "final/-".into()),
        ],
        "{got:?}"
    );
    let tag = |turn: &str| got.iter().find(|r| r.turn_id == turn).map(|r| r.message_id.clone());
    assert!(tag("t2").is_some_and(|id| id.contains(":t2:rejected-follow-up-")), "{got:?}");

    // The session's mode decides for a turn that names none; and a turn that waits for the
    // client's tool results makes a rejecting follow-up `awaiting`, not `busy`.
    let s = new_session();
    let mut t1 = user_turn(&s, "t1", "@call(run_tests) what is in the sample repo?");
    t1["ConversationContextId"] = json!("strict");
    h.sim.set_latency(Latency::default());
    h.submit(&t1).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(got.last().unwrap().headers["x-aptix-outcome"], "client_tool_continuation");
    let mut t2 = user_turn(&s, "t2", "are you done?");
    t2["FollowUp"] = json!("reject");
    h.submit(&t2).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(ends(&got), [("t2".into(), "refused/session.awaiting_tool_results".into())]);
    let mut t3 = user_turn(&s, "t3", "never mind");
    t3["FollowUp"] = json!("interrupt");
    h.submit(&t3).await;
    let got = h.replies(&s, 2, WAIT).await;
    assert_eq!(
        ends(&got),
        [("t1".into(), "failed/turn.cancelled".into()), ("t3".into(), "final/-".into())],
        "strict allows a request's interrupt; the default mode would not: {got:?}"
    );
    h.teardown().await;
}
