//! Cancelling turns (issue 19, point 1): a client publishes `type` = `turn.cancel` with
//! `{"SessionId", "TurnId"}` to the entry point. A queued turn never runs, a streaming turn's
//! provider call is aborted (its HTTP stream closed, no delta after the reply), a turn awaiting
//! tool results ends; each gets one `turn.cancelled` reply and the session's next turn runs.
//! Cancels that change nothing get a specific refusal, or nothing when repeated.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use aptix::sim::Latency;
use common::{new_session, reply_of, user_turn, Harness, ReplyMsg};
use futures_util::StreamExt as _;
use lapin::options::BasicAckOptions;
use serde_json::json;

/// Reads one session's reply queue message by message.
struct Reader {
    _ch: lapin::Channel,
    consumer: lapin::Consumer,
}

impl Reader {
    async fn open(h: &Harness, s: &str) -> Reader {
        let (ch, consumer) = h.consume_replies(s).await;
        Reader { _ch: ch, consumer }
    }

    async fn next(&mut self, limit: Duration) -> Option<ReplyMsg> {
        let Ok(Some(Ok(d))) = tokio::time::timeout(limit, self.consumer.next()).await else {
            return None;
        };
        d.ack(BasicAckOptions::default()).await.unwrap();
        Some(reply_of(&d))
    }

    /// Messages until a reply (not a delta) for `turn`, which comes last.
    async fn until_reply(&mut self, turn: &str, limit: Duration) -> Vec<ReplyMsg> {
        let deadline = Instant::now() + limit;
        let mut out = Vec::new();
        while let Some(m) = self.next(deadline.saturating_duration_since(Instant::now())).await {
            let done = m.turn_id == turn && m.body.get("Delta").is_none();
            out.push(m);
            if done {
                return out;
            }
        }
        panic!("no reply for {turn} within {limit:?}: {out:?}");
    }
}

fn code(m: &ReplyMsg) -> &str {
    m.body["Errors"][0]["Code"].as_str().unwrap_or("")
}

fn long_instruction() -> String {
    let words = "explain send_invoice_email and every retry path in detail ";
    format!("Stream a long answer. {}", words.repeat(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_and_a_streaming_turn_are_cancelled_and_the_next_turn_runs() {
    let h = Harness::start(1).await;
    h.sim.set_latency(Latency { fixed_ms: 0, jitter_ms: 0, per_event_ms: 60 });
    let s = new_session();
    let mut t1 = user_turn(&s, "t1", &long_instruction());
    t1["Stream"] = json!(true);
    h.submit(&t1).await;
    h.submit(&user_turn(&s, "t2", "queued, then cancelled")).await;
    h.submit(&user_turn(&s, "t3", "runs after both")).await;
    let mut reader = Reader::open(&h, &s).await;
    let mut relayed = String::new();
    while relayed.is_empty() {
        let delta = reader.next(Duration::from_secs(30)).await.expect("t1 streams");
        assert_eq!(delta.body["Delta"], true, "{delta:?}");
        relayed.extend(delta.body["Event"]["Text"].as_str());
    }

    h.cancel(&s, "t2").await;
    let until_t2 = reader.until_reply("t2", Duration::from_secs(20)).await;
    // t1 goes on streaming meanwhile: its deltas read here are part of what was relayed.
    let t1_meanwhile = until_t2.iter().filter(|m| m.turn_id == "t1");
    relayed.extend(t1_meanwhile.filter_map(|d| d.body["Event"]["Text"].as_str()));
    let t2 = until_t2.last().unwrap();
    assert_eq!((t2.body["Successful"].as_bool(), code(t2)), (Some(false), "turn.cancelled"));
    assert_eq!(t2.headers["x-aptix-outcome"], "failed");
    assert_eq!(t2.message_id, format!("reply:{s}:t2:step-0"));

    let asked = Instant::now();
    h.cancel(&s, "t1").await;
    let streamed = reader.until_reply("t1", Duration::from_secs(20)).await;
    let took = asked.elapsed();
    let (reply, deltas) = streamed.split_last().unwrap();
    assert_eq!(code(reply), "turn.cancelled", "{reply:?}");
    assert!(deltas.iter().all(|d| d.body["Delta"] == true), "{deltas:?}");
    // The whole stream takes well over 10 s at this pace: the call was aborted, not finished.
    assert!(took < Duration::from_secs(5), "the cancel took {took:?}");
    assert_eq!(h.sim.stats().streams_abandoned, 1, "the provider's stream was closed");

    let rest = reader.until_reply("t3", Duration::from_secs(60)).await;
    assert!(rest.iter().all(|m| m.turn_id == "t3"), "no delta of t1 after its reply: {rest:?}");
    assert_eq!(rest.last().unwrap().body["Successful"], true);
    assert_eq!(h.sim.requests().len(), 2, "t2 never called the provider");

    let records = h.records(&s).await;
    let kinds: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["turn_id"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("t2", "cancelled"), ("t1", "cancelled"), ("t3", "final")]);
    // The store wrote t2's record itself (cancelled while queued): it still names the versions
    // of the contexts the turn would have run with.
    let t2 = &records.iter().find(|r| r["turn_id"] == "t2").unwrap()["context_versions"];
    assert_eq!(t2["ConversationContext"]["Id"], "default", "{t2}");
    assert_eq!(t2["AgentContext"]["Version"].as_str().map(str::len), Some(16), "{t2}");
    let t1_record = records.iter().find(|r| r["turn_id"] == "t1").unwrap();
    let kept = t1_record["response_payload"]["streamed_text"].as_str().unwrap();
    assert!(!kept.is_empty(), "the record keeps what the model had streamed");
    relayed.extend(deltas.iter().filter_map(|d| d.body["Event"]["Text"].as_str()));
    assert!(kept.starts_with(&relayed), "{kept:?} vs the relayed {relayed:?}");
    // The aborted call spent tokens no answer reported: charged by estimate (docs/tenancy.md),
    // from the request body sent and the text streamed; t2, never sent, is charged nothing.
    assert_eq!(t1_record["response_payload"]["usage_estimated"], true, "{t1_record}");
    let total = t1_record["usage"]["TotalTokens"].as_u64().unwrap();
    let streamed_tokens = t1_record["usage"]["OutputTokens"].as_u64().unwrap();
    assert!(streamed_tokens >= (kept.chars().count() as u64).div_ceil(4), "{t1_record}");
    assert!(total > streamed_tokens, "the request's input is charged too: {t1_record}");
    let t2_record = records.iter().find(|r| r["turn_id"] == "t2").unwrap();
    assert!(t2_record["usage"].is_null(), "{t2_record}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_awaiting_tool_results_is_cancelled_and_later_cancels_change_nothing() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "Read the file @call(read_file)")).await;
    let mut reader = Reader::open(&h, &s).await;
    let asked = reader.until_reply("t1", Duration::from_secs(30)).await;
    let call = &asked.last().unwrap().body["Result"]["ToolCalls"][0];
    assert!(call["ToolCallId"].is_string(), "{asked:?}");

    h.cancel(&s, "t1").await;
    let ended = reader.until_reply("t1", Duration::from_secs(20)).await;
    let ended = ended.last().unwrap();
    assert_eq!(code(ended), "turn.cancelled");
    assert_eq!(ended.message_id, format!("reply:{s}:t1:step-1"));
    assert_eq!(ended.headers["x-aptix-final"], "true");

    let results = json!({"SessionId": s, "TurnId": "t1", "ToolResults": [
        {"ToolCallId": call["ToolCallId"], "ExecutionMs": 3, "ResultJson": "{}"}]});
    h.submit(&results).await;
    let late = reader.until_reply("t1", Duration::from_secs(20)).await;
    assert_eq!(code(late.last().unwrap()), "tool_results.turn_cancelled");
    assert_eq!(late.last().unwrap().headers["x-aptix-outcome"], "refused");

    // A second cancel adds nothing; the next message is the answer to an unknown turn's.
    h.cancel(&s, "t1").await;
    h.cancel(&s, "nope").await;
    let unknown = reader.next(Duration::from_secs(20)).await.unwrap();
    assert_eq!((unknown.turn_id.as_str(), code(&unknown)), ("nope", "turn.not_found"));
    assert!(unknown.message_id.contains(":nope:rejected-cancel-"), "{}", unknown.message_id);

    h.submit(&user_turn(&s, "t2", "the session is free again")).await;
    let t2 = reader.until_reply("t2", Duration::from_secs(30)).await;
    assert_eq!(t2.last().unwrap().body["Successful"], true);
    h.cancel(&s, "t2").await;
    let finished = reader.next(Duration::from_secs(20)).await.unwrap();
    assert_eq!(code(&finished), "turn.finished");

    // An unknown property is refused; a NUL in its name, which the refusal quotes, as promptly.
    for (name, quoted) in [("Why", "Why"), ("W\u{0}hy", "W\\0hy")] {
        let mut bad = json!({"SessionId": s, "TurnId": "t2"});
        bad[name] = json!(1);
        let bad = serde_json::to_vec(&bad).unwrap();
        let mut msg = h.topology.request(&s, uuid::Uuid::new_v4().to_string(), bad);
        msg.kind = "turn.cancel".into();
        h.publisher.publish(&msg).await.unwrap();
        let refused = reader.next(Duration::from_secs(20)).await.unwrap();
        assert_eq!(code(&refused), "request.unknown_field");
        assert_eq!(refused.body["Errors"][0]["Field"], quoted);
    }
    assert!(reader.next(Duration::from_secs(2)).await.is_none(), "nothing else arrives");

    let records = h.records(&s).await;
    let kinds: Vec<&str> = records.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["client_tool_continuation", "cancelled", "final"]);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_cancelled_between_stages_never_calls_the_provider() {
    let mut h = Harness::start(0).await;
    let s = new_session();
    // Only admission runs: the turn is admitted and waits in retrieve's queue.
    let admit = admit_only(&h);
    h.submit(&user_turn(&s, "t1", "cancelled before it reaches the provider")).await;
    wait_state(&h, &s, "t1", "running").await;
    h.cancel(&s, "t1").await;
    let wait = Instant::now();
    while !cancel_requested(&h, &s, "t1").await {
        assert!(wait.elapsed() < Duration::from_secs(30), "the cancel was never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.stop_consumers().await;
    let _ = admit.await;
    h.run(1);
    let replies = h.replies(&s, 1, Duration::from_secs(30)).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(code(&replies[0]), "turn.cancelled");
    assert!(h.sim.requests().is_empty(), "the provider was never called");
    h.teardown().await;
}

/// Runs only admission (until the harness's consumers stop).
fn admit_only(h: &Harness) -> tokio::task::JoinHandle<()> {
    let (deps, token) = (h.deps.clone(), h.shutdown.clone());
    tokio::spawn(async move {
        aptix::pipeline::run(deps, &[aptix::broker::StageName::new("validate")], 1, token).await
    })
}

/// Waits until turn `t` is in `state`.
async fn wait_state(h: &Harness, s: &str, t: &str, state: &str) {
    let wait = Instant::now();
    while turn_state(h, s, t).await.as_deref() != Some(state) {
        assert!(wait.elapsed() < Duration::from_secs(30), "{t} never became {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn turn_state(h: &Harness, s: &str, t: &str) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1::uuid AND turn_id = $2")
        .bind(s)
        .bind(t)
        .fetch_optional(h.deps.store.pool())
        .await
        .unwrap()
}

async fn cancel_requested(h: &Harness, s: &str, t: &str) -> bool {
    let v: Option<bool> = sqlx::query_scalar(
        "SELECT cancel_requested_at IS NOT NULL FROM turns WHERE session_id = $1::uuid AND turn_id = $2",
    )
    .bind(s)
    .bind(t)
    .fetch_optional(h.deps.store.pool())
    .await
    .unwrap();
    v == Some(true)
}

/// A cancel redelivered after its first delivery committed but did not publish (a crash in
/// between) publishes what was committed: the turn's reply and the session's next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_cancel_publishes_what_the_first_one_committed() {
    let mut h = Harness::start(0).await;
    let s = new_session();
    let admit = admit_only(&h);
    h.submit(&user_turn(&s, "t1", "runs")).await;
    h.submit(&user_turn(&s, "t2", "waits, then is cancelled")).await;
    wait_state(&h, &s, "t2", "queued").await;
    h.stop_consumers().await;
    let _ = admit.await;
    let key = aptix::contracts::TurnKey {
        session_id: s.parse().unwrap(),
        turn_id: "t2".parse().unwrap(),
    };
    let aptix::store::CancelAdmission::Ended { outbox } =
        h.deps.store.cancel_turn(&key, None).await.unwrap()
    else {
        panic!("a queued turn ends at once")
    };
    assert!(!outbox.ids.is_empty());
    // The first delivery "crashed" before publishing: the rows are still there.
    let again = h.deps.store.cancel_turn(&key, None).await.unwrap();
    let aptix::store::CancelAdmission::AlreadyCancelled { outbox: pending } = again else {
        panic!("not already cancelled: {again:?}")
    };
    assert_eq!(pending.ids, outbox.ids, "the committed reply is published by the redelivery");
    h.teardown().await;
}
