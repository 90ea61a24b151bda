//! Resuming a turn's stream (docs/client-protocol.md §9a): every delta and step reply carries
//! `x-aptix-event-seq`; a `turn.resume` after a cursor sends again, as they were first sent, the
//! turn's events after it (kept deltas, then step replies), then a `resumed` notice, while the
//! live events go on. A client that drops what it already has by `message_id` sees every event
//! once, in order.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::common::{new_session, user_turn, Harness, ReplyMsg};
use aptix::sim::Latency;

const WAIT: Duration = Duration::from_secs(60);

/// Publishes a resume the documented way (`type` = `turn.resume`).
async fn resume(h: &Harness, s: &str, t: &str, after: Option<i64>) {
    let mut body = json!({"SessionId": s, "TurnId": t});
    if let Some(after) = after {
        body["AfterSeq"] = json!(after);
    }
    let body = serde_json::to_vec(&body).unwrap();
    let mut msg = h.topology.request(s, uuid::Uuid::new_v4().to_string(), body);
    msg.kind = "turn.resume".into();
    h.publisher.publish(&msg).await.unwrap();
}

fn seq(m: &ReplyMsg) -> i64 {
    m.headers.get("x-aptix-event-seq").and_then(|v| v.parse().ok()).unwrap_or(-1)
}

/// Reads the session's queue until `done` holds for what was read.
async fn read_until(h: &Harness, s: &str, done: impl Fn(&[ReplyMsg]) -> bool) -> Vec<ReplyMsg> {
    h.read_until(s, WAIT, done).await
}

fn kind(m: &ReplyMsg) -> &str {
    m.headers.get("x-aptix-kind").map_or("", String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_resumes_after_a_cursor_every_event_once_in_order() {
    let mut h = Harness::start(0).await;
    h.run(1);
    h.sim.set_latency(Latency { fixed_ms: 0, jitter_ms: 0, per_event_ms: 40 });
    let s = new_session();
    let words = "explain send_invoice_email and every retry path in detail ";
    let mut t1 = user_turn(&s, "t1", &format!("Stream a long answer. {}", words.repeat(12)));
    t1["Stream"] = json!(true);
    h.submit(&t1).await;
    // The client reads four deltas, then its process dies and its queue with it: what is
    // published meanwhile is lost. A new process declares the queue again and resumes.
    let first = read_until(&h, &s, |got| got.len() >= 4).await;
    assert!(first.iter().all(|m| kind(m) == "delta"), "{first:?}");
    let cursor = seq(&first[3]);
    assert_eq!(cursor, 3, "delta 3 of step 0");
    let queue = format!("{}.session.{s}", h.topology.prefix());
    let ch = h.conn.create_channel().await.unwrap();
    ch.queue_delete(queue.as_str().into(), Default::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.topology.declare_client_queue(&ch, &s.parse().unwrap()).await.unwrap();

    resume(&h, &s, "t1", Some(cursor)).await;
    let rest = read_until(&h, &s, |got| {
        got.iter().any(|m| kind(m) == "resumed") && got.iter().any(|m| kind(m) == "reply")
    })
    .await;
    let notice = rest.iter().find(|m| kind(m) == "resumed").unwrap();
    assert_eq!(notice.body["AfterSeq"], cursor);
    assert_eq!(notice.message_id.split(':').take(3).collect::<Vec<_>>(), ["resumed", &s, "t1"]);
    // What the client holds, each message id once, by event sequence.
    let mut held: BTreeMap<i64, String> = BTreeMap::new();
    for m in first.iter().chain(&rest).filter(|m| kind(m) != "resumed") {
        let id = held.entry(seq(m)).or_insert_with(|| m.message_id.clone());
        assert_eq!(*id, m.message_id, "one id per event sequence");
    }
    let deltas: Vec<i64> = held.keys().copied().filter(|n| *n < 999_999).collect();
    assert_eq!(deltas, (0..deltas.len() as i64).collect::<Vec<_>>(), "no delta missing");
    assert_eq!(held.keys().last(), Some(&999_999), "the step's reply comes last");

    // After the end: the same cursor gets the kept deltas and the reply again, then the notice.
    resume(&h, &s, "t1", Some(cursor)).await;
    let again = read_until(&h, &s, |got| got.iter().any(|m| kind(m) == "resumed")).await;
    let order: Vec<i64> = again.iter().filter(|m| kind(m) != "resumed").map(seq).collect();
    let want: Vec<i64> = held.keys().copied().filter(|n| *n > cursor).collect();
    assert_eq!(order, want, "every event after the cursor, in order");
    let reply = again.iter().find(|m| kind(m) == "reply").unwrap();
    assert_eq!(reply.message_id, format!("reply:{s}:t1:step-0"), "sent as first sent");
    assert!(reply.headers.contains_key("x-aptix-session-name"), "{:?}", reply.headers);
    let notice = again.last().unwrap();
    assert_eq!((kind(notice), &notice.body["Ended"]), ("resumed", &json!(true)));
    assert_eq!(notice.body["UpToSeq"], 999_999);

    // Publishing a running turn's request again attaches to it: everything from the start.
    let mut t2 = user_turn(&s, "t2", &format!("Stream it again. {}", words.repeat(12)));
    t2["Stream"] = json!(true);
    h.submit(&t2).await;
    let early = read_until(&h, &s, |got| got.len() >= 2).await;
    assert!(early.iter().all(|m| kind(m) == "delta" && m.turn_id == "t2"), "{early:?}");
    h.submit(&t2).await;
    let attached = read_until(&h, &s, |got| {
        got.iter().any(|m| kind(m) == "resumed") && got.iter().any(|m| kind(m) == "reply")
    })
    .await;
    let notice = attached.iter().find(|m| kind(m) == "resumed").unwrap();
    assert_eq!(notice.body["AfterSeq"], serde_json::Value::Null, "{notice:?}");
    let ids: std::collections::BTreeSet<i64> =
        attached.iter().map(seq).filter(|n| *n >= 0).collect();
    assert!(ids.contains(&0) && ids.contains(&1), "the deltas read before come again: {ids:?}");
    let replies: std::collections::BTreeSet<&str> =
        attached.iter().filter(|m| kind(m) == "reply").map(|m| m.message_id.as_str()).collect();
    assert_eq!(replies.len(), 1, "admitted once: one reply (copies share its id)");

    // A turn the session does not have is refused.
    resume(&h, &s, "nope", None).await;
    let refused = read_until(&h, &s, |got| !got.is_empty()).await;
    assert_eq!(refused[0].body["Errors"][0]["Code"], "turn.not_found", "{refused:?}");
    assert!(refused[0].message_id.contains(":nope:rejected-resume-"), "{refused:?}");
    h.teardown().await;
}

/// A session may resume `pipeline.resumes_per_minute` times a minute; more are refused with
/// `limit.resumes_per_minute` and send nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resumes_past_the_sessions_limit_are_refused() {
    let h = Harness::start_with(1, |s| s.pipeline.resumes_per_minute = 2).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "a short answer")).await;
    let _ = h.replies(&s, 1, WAIT).await;
    for _ in 0..3 {
        resume(&h, &s, "t1", None).await;
    }
    let refused = |m: &ReplyMsg| m.headers.get("x-aptix-outcome").is_some_and(|o| o == "refused");
    let ends = |got: &[ReplyMsg]| got.iter().filter(|m| kind(m) == "resumed" || refused(m)).count();
    let got = read_until(&h, &s, |got| ends(got) >= 3).await;
    assert_eq!(got.iter().filter(|m| kind(m) == "resumed").count(), 2, "{got:?}");
    let no: Vec<&ReplyMsg> = got.iter().filter(|m| refused(m)).collect();
    assert_eq!(no.len(), 1, "{got:?}");
    assert_eq!(no[0].body["Errors"][0]["Code"], "limit.resumes_per_minute");
    assert!(no[0].message_id.contains(":t1:rejected-resume-"), "{}", no[0].message_id);
    // Two replays of the turn's one reply, nothing for the third.
    assert_eq!(got.iter().filter(|m| kind(m) == "reply" && !refused(m)).count(), 2, "{got:?}");
    h.teardown().await;
}

/// Publishing a running turn's request again attaches to it, sending its kept events again as
/// a resume does, so it is counted as one: past `pipeline.resumes_per_minute` the copy is
/// refused with `limit.resumes_per_minute` and sends nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attaching_past_the_sessions_resume_limit_is_refused() {
    let mut h = Harness::start_with(0, |s| s.pipeline.resumes_per_minute = 1).await;
    h.run(1);
    h.sim.set_latency(Latency { fixed_ms: 3_000, jitter_ms: 0, per_event_ms: 0 });
    let s = new_session();
    let t1 = user_turn(&s, "t1", "a slow answer");
    h.submit(&t1).await;
    h.submit(&t1).await;
    h.submit(&t1).await;
    let refused = |m: &ReplyMsg| m.headers.get("x-aptix-outcome").is_some_and(|o| o == "refused");
    let answered = |m: &ReplyMsg| kind(m) == "reply" && !refused(m);
    let got = read_until(&h, &s, |got| {
        got.iter().any(|m| kind(m) == "resumed")
            && got.iter().any(refused)
            && got.iter().any(answered)
    })
    .await;
    assert_eq!(got.iter().filter(|m| kind(m) == "resumed").count(), 1, "{got:?}");
    let no: Vec<&ReplyMsg> = got.iter().filter(|m| refused(m)).collect();
    assert_eq!(no.len(), 1, "{got:?}");
    assert_eq!(no[0].body["Errors"][0]["Code"], "limit.resumes_per_minute");
    assert!(no[0].message_id.contains(":t1:rejected-resume-"), "{}", no[0].message_id);
    // It answers the copy it refuses, and is kept as every refusal is (§9a).
    assert!(no[0].correlation_id.is_some(), "{:?}", no[0]);
    let kept = "SELECT count(*) FROM replies WHERE session_id = $1::uuid AND message_id = $2";
    let kept: i64 = sqlx::query_scalar(kept)
        .bind(&s)
        .bind(&no[0].message_id)
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap();
    assert_eq!(kept, 1, "the refusal is not stored");
    assert_eq!(got.iter().filter(|m| answered(m)).count(), 1, "admitted once: {got:?}");
    h.teardown().await;
}
