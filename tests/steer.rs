//! Follow-ups that steer (docs/client-protocol.md §11, "Follow-ups", `steer`): a turn sent with
//! `FollowUp: steer` while its session's turn runs joins that turn's next model call after the
//! tool results, and ends with that turn, that ending about itself with a `turn.steered`
//! warning; one that comes when no further call is made runs as its own turn; a steering turn
//! with more than an instruction is refused.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{new_session, user_turn, Harness, ReplyMsg};
use aptix::sim::Latency;

const WAIT: Duration = Duration::from_secs(60);

/// `(turn, outcome/first error, first warning)` of each reply that ends a step, in order.
fn ends(replies: &[ReplyMsg]) -> Vec<(String, String, String)> {
    let code = |v: &Value| v[0]["Code"].as_str().unwrap_or("-").to_owned();
    replies
        .iter()
        .filter(|r| r.is_final)
        .map(|r| {
            let outcome = format!("{}/{}", r.headers["x-aptix-outcome"], code(&r.body["Errors"]));
            (r.turn_id.clone(), outcome, code(&r.body["Warnings"]))
        })
        .collect()
}

fn steer(s: &str, turn: &str, text: &str) -> Value {
    let mut t = user_turn(s, turn, text);
    t["FollowUp"] = json!("steer");
    t
}

fn results_for(s: &str, turn: &str, asked: &ReplyMsg) -> Value {
    let call = &asked.body["Result"]["ToolCalls"][0];
    json!({"SessionId": s, "TurnId": turn, "ToolResults": [
        {"ToolCallId": call["ToolCallId"], "ExecutionMs": 3, "ResultJson": "{\"contents\":\"fn main() {}\"}"}]})
}

async fn state_and_kind(h: &Harness, s: &str, turn: &str) -> (String, Vec<String>) {
    let state: String =
        sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1::uuid AND turn_id = $2")
            .bind(s)
            .bind(turn)
            .fetch_one(h.deps.store.pool())
            .await
            .unwrap();
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM response_records WHERE session_id = $1::uuid AND turn_id = $2 ORDER BY step",
    )
    .bind(s)
    .bind(turn)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap();
    (state, kinds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steer_joins_the_next_round_trip_and_ends_with_its_turn() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "Read the file @call(read_file)")).await;
    let asked = h.replies(&s, 1, WAIT).await;
    assert_eq!(asked.last().unwrap().headers["x-aptix-outcome"], "client_tool_continuation");

    // Both wait for t1's tool results (a reject would be `session.awaiting_tool_results`).
    h.submit(&steer(&s, "t2", "Also mention the retry path.")).await;
    h.submit(&steer(&s, "t3", "And keep it short.")).await;
    h.submit(&results_for(&s, "t1", asked.last().unwrap())).await;
    let got = h.replies(&s, 3, WAIT).await;
    let steered = ("final/-".to_owned(), "turn.steered".to_owned());
    assert_eq!(
        ends(&got),
        [
            ("t1".into(), "final/-".into(), "-".into()),
            ("t2".into(), steered.0.clone(), steered.1.clone()),
            ("t3".into(), steered.0, steered.1),
        ],
        "{got:?}"
    );
    let reply = |t: &str| got.iter().find(|r| r.turn_id == t && r.is_final).unwrap();
    let (t1, t2) = (reply("t1"), reply("t2"));
    assert_eq!(t2.message_id, format!("reply:{s}:t2:step-0"));
    assert_eq!(t2.body["TurnId"], "t2");
    assert_eq!(t2.body["Result"]["TurnId"], "t2");
    assert_eq!(t2.body["Result"]["PrimaryOutputText"], t1.body["Result"]["PrimaryOutputText"]);
    assert!(t2.body["Result"].get("Usage").is_none(), "the tokens were t1's: {:?}", t2.body);

    // The call after the results carried both instructions, after the outputs, in order.
    let bodies = h.sim.request_bodies();
    let body = bodies
        .iter()
        .find(|b| b["input"][0]["type"] == "function_call_output")
        .expect("the continuation's request");
    crate::assemble_support::write_request_body("steered-continuation-live", body);
    let texts: Vec<&str> = body["input"].as_array().unwrap()[1..]
        .iter()
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 2, "{body}");
    assert!(texts[0].ends_with("Also mention the retry path.") && texts[1].ends_with("short."));

    assert_eq!(state_and_kind(&h, &s, "t2").await, ("completed".into(), vec!["steered".into()]));
    assert_eq!(state_and_kind(&h, &s, "t1").await.0, "completed");

    // A copy of a steer changes nothing: its stored reply again.
    h.submit(&steer(&s, "t2", "Also mention the retry path.")).await;
    let again = h.replies(&s, 1, WAIT).await;
    let again = again.last().unwrap();
    assert!(again.message_id.starts_with(&format!("reply:{s}:t2:resent-")), "{again:?}");
    assert_eq!(again.body, t2.body);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steer_too_late_runs_as_its_own_turn_and_one_with_files_is_refused() {
    let h = Harness::start(1).await;
    h.sim.set_latency(Latency { fixed_ms: 1500, jitter_ms: 0, per_event_ms: 0 });
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "a short answer")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // t1 makes no further call: t2 waits, then runs as any queued turn.
    h.submit(&steer(&s, "t2", "and this too")).await;
    let mut with_file = steer(&s, "t3", "look at this file");
    with_file["InputArtifacts"] = json!([{"RelativePath": "src/a.rs", "FileName": "a.rs",
        "Contents": "fn a() {}", "Origin": "ide"}]);
    h.submit(&with_file).await;
    let got = h.replies(&s, 3, WAIT).await;
    let ends = ends(&got);
    assert_eq!(ends[0].0, "t3", "{got:?}");
    assert_eq!(ends[0].1, "refused/validation.follow_up_invalid");
    assert_eq!(
        ends[1..],
        [("t1".into(), "final/-".into(), "-".into()), ("t2".into(), "final/-".into(), "-".into())],
        "{got:?}"
    );
    assert_eq!(state_and_kind(&h, &s, "t2").await, ("completed".into(), vec!["final".into()]));

    // With no turn running, a steer is a turn like any other.
    h.sim.set_latency(Latency::default());
    h.submit(&steer(&s, "t4", "now this")).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(self::ends(&got), [("t4".into(), "final/-".into(), "-".into())]);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steer_taken_in_ends_as_its_turn_does_when_that_turn_is_cancelled() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "Read the file @call(read_file)")).await;
    let asked = h.replies(&s, 1, WAIT).await;
    // The steer asks for the tool again: the call it joins ends waiting for results once more.
    h.submit(&steer(&s, "t2", "Read it once more @call(read_file)")).await;
    h.submit(&results_for(&s, "t1", asked.last().unwrap())).await;
    let again = h.replies(&s, 1, WAIT).await;
    let last = again.last().unwrap();
    assert_eq!(
        (last.turn_id.as_str(), last.headers["x-aptix-outcome"].as_str()),
        ("t1", "client_tool_continuation")
    );
    assert_eq!(state_and_kind(&h, &s, "t2").await.0, "steered");
    // A steered turn is the turn it steered now: cancelled alone it is not.
    h.cancel(&s, "t2").await;
    h.cancel(&s, "t1").await;
    let got = h.replies(&s, 3, WAIT).await;
    assert_eq!(
        ends(&got),
        [
            ("t2".into(), "refused/turn.finished".into(), "-".into()),
            ("t1".into(), "failed/turn.cancelled".into(), "-".into()),
            ("t2".into(), "failed/turn.cancelled".into(), "turn.steered".into()),
        ],
        "{got:?}"
    );
    let (state, kinds) = state_and_kind(&h, &s, "t2").await;
    assert_eq!((state.as_str(), kinds), ("failed", vec!["steered".to_owned()]));
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steer_in_another_mode_waits_as_a_turn_of_its_own() {
    let h = Harness::start_with(1, |s| {
        let default = s.default_conversation_context.clone();
        let other = s.conversation_contexts[&default].clone();
        s.conversation_contexts.insert("other".into(), other);
    })
    .await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "Read the file @call(read_file)")).await;
    let asked = h.replies(&s, 1, WAIT).await;
    // Not a steer of t1 (it runs in another mode): an enqueued turn, refused while t1 waits.
    let mut t2 = steer(&s, "t2", "in the other mode");
    t2["ConversationContextId"] = json!("other");
    h.submit(&t2).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(ends(&got)[0].1, "refused/session.awaiting_tool_results", "{got:?}");
    // The refused steer left the session's mode as it was: t1's results run in t1's mode.
    h.submit(&results_for(&s, "t1", asked.last().unwrap())).await;
    let got = h.replies(&s, 1, WAIT).await;
    assert_eq!(ends(&got), [("t1".into(), "final/-".into(), "-".into())]);
    let mode = h.session_mode(&s).await;
    assert_ne!(mode.as_deref(), Some("other"));
    h.teardown().await;
}
