//! Replies per backend instance (docs/client-protocol.md §4a), against the real broker and
//! database: requests that name `P.instance.I` in `reply_to` get every reply and delta of every
//! session on that one queue, in per-session order, and no session queue is created; a
//! `reply_to` naming anything else is refused on the session's queue.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{new_session, reply_of, user_turn, Harness, ReplyMsg};
use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

/// Publishes `request` to the entry exchange as §4a says: confirmed, with `reply_to`.
async fn publish_with_reply_to(h: &Harness, request: &Value, reply_to: &str) {
    let ch = h.conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let session = request["SessionId"].as_str().unwrap();
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(uuid::Uuid::new_v4().to_string().into())
        .with_reply_to(reply_to.into());
    let body = serde_json::to_vec(request).unwrap();
    let exchange = h.topology.requests_exchange();
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm = ch.basic_publish(exchange.as_str().into(), session.into(), options, &body, props);
    assert!(confirm.await.unwrap().await.unwrap().is_ack());
    let _ = ch.close(200, "published".into()).await;
}

/// Declares backend instance `name`'s queue as its client does (§4a), on a channel of its own.
async fn instance_queue(h: &Harness, name: &str) -> (lapin::Channel, String) {
    let instance = format!("{}.instance.{name}", h.topology.prefix());
    let ch = h.conn.create_channel().await.unwrap();
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(instance.as_str().into(), durable, FieldTable::default()).await.unwrap();
    (ch, instance)
}

async fn queue_exists(h: &Harness, queue: &str) -> bool {
    let ch = h.conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    ch.queue_declare(queue.into(), passive, FieldTable::default()).await.is_ok()
}

/// Reads `queue` until `finals` replies (not deltas) arrived.
async fn read(h: &Harness, queue: &str, finals: usize) -> Vec<ReplyMsg> {
    let ch = h.conn.create_channel().await.unwrap();
    let options = BasicConsumeOptions::default();
    let consume = ch.basic_consume(queue.into(), "".into(), options, FieldTable::default());
    let mut consumer = consume.await.unwrap();
    let mut out: Vec<ReplyMsg> = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.iter().filter(|r| r.is_final).count() < finals {
        let Ok(Some(Ok(d))) = tokio::time::timeout_at(deadline, consumer.next()).await else {
            panic!("{} of {finals} replies on {queue}: {out:?}", out.len())
        };
        d.ack(BasicAckOptions::default()).await.unwrap();
        out.push(reply_of(&d));
    }
    let _ = ch.close(200, "done".into()).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_instance_queue_gets_every_sessions_replies_in_order() {
    let h = Harness::start(2).await;
    let (ch, instance) = instance_queue(&h, "backend-1").await;
    let sessions: Vec<String> = (0..6).map(|_| new_session()).collect();
    for t in 0..3 {
        for s in &sessions {
            let mut request = user_turn(s, &format!("t{t}"), "go");
            // One streamed turn: its deltas follow the replies to the instance queue.
            if t == 1 {
                request["Stream"] = json!(true);
            }
            publish_with_reply_to(&h, &request, &instance).await;
        }
    }
    let got = read(&h, &instance, sessions.len() * 3).await;
    let mut per_session: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut deltas = 0;
    for r in &got {
        let session = r.headers["x-aptix-session-id"].clone();
        if r.is_final {
            per_session.entry(session).or_default().push(r.turn_id.clone());
        } else {
            deltas += 1;
        }
    }
    for s in &sessions {
        assert_eq!(per_session[s], ["t0", "t1", "t2"], "session {s}");
        let queue = h.topology.session_queue(&s.parse().unwrap());
        assert!(!queue_exists(&h, &queue).await, "no session queue is made: {queue}");
        assert_eq!(h.records(s).await.len(), 3);
    }
    assert!(deltas > 0, "the streamed turns' deltas reach the instance queue");
    let _ = ch.queue_delete(instance.as_str().into(), Default::default()).await;
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reply_to_that_is_no_reply_queue_is_refused() {
    let h = Harness::start(1).await;
    let s = new_session();
    let sid = s.parse().unwrap();
    h.topology.declare_client_queue(h.publisher.channel(), &sid).await.unwrap();
    h.sessions.lock().unwrap().insert(sid);
    // A stage queue: the server must never publish a reply there.
    let stage = h.topology.stage_queue(aptix::broker::StageName::new("persist"));
    publish_with_reply_to(&h, &user_turn(&s, "t1", "go"), &stage).await;
    // The session's own queue is the default, named or not.
    let own = h.topology.session_queue(&sid);
    publish_with_reply_to(&h, &user_turn(&s, "t2", "go"), &own).await;
    // A NUL in what the refusal quotes: stored replies are `jsonb`, which holds no NUL, so the
    // refusal must not carry one (it was retried in place for minutes, holding a validate slot).
    publish_with_reply_to(&h, &user_turn(&s, "t3", "go"), "x\u{0}y").await;
    let replies = h.replies(&s, 3, WAIT).await;
    // Refusals need no pipeline run: t3's may come before t2's answer.
    let last = |t: &str| replies.iter().rfind(|r| r.is_final && r.turn_id == t).unwrap();
    assert_eq!(last("t1").headers["x-aptix-outcome"], "refused");
    assert_eq!(last("t1").body["Errors"][0]["Code"], "request.reply_to_invalid");
    assert_eq!(last("t2").body["Successful"], true);
    assert_eq!(last("t3").headers["x-aptix-outcome"], "refused");
    let error = &last("t3").body["Errors"][0];
    assert_eq!(error["Code"], "request.reply_to_invalid");
    assert!(error["Message"].as_str().unwrap().contains("`x\\0y`"), "{error}");
    assert_eq!(h.records(&s).await.len(), 1, "the refused turn was never admitted");
    h.teardown().await;
}

/// A request given up before admission (the database failed under it) and replayed by an
/// operator is sent again with the `reply_to` its client gave: both the first answer (that it
/// could not be processed) and the replayed turn's reach the instance queue, and no session
/// queue is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_request_answers_the_instance_queue_it_named() {
    let h = Harness::start(1).await;
    let (ch, instance) = instance_queue(&h, "backend-2").await;
    let s = new_session();
    let sql = |statement: &'static str| sqlx::query(statement).execute(h.deps.store.pool());
    sql("ALTER TABLE turns RENAME TO turns_away").await.unwrap();
    publish_with_reply_to(&h, &user_turn(&s, "t1", "hello"), &instance).await;
    let first = read(&h, &instance, 1).await;
    sql("ALTER TABLE turns_away RENAME TO turns").await.unwrap();
    assert_eq!(first[0].body["Errors"][0]["Code"], "internal.error", "{}", first[0].body);
    let (code, out) = h.aptix(&["dead", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["headers"]["x-aptix-reply-to"], instance.as_str(), "{out}");
    let id = listed[0]["id"].as_str().unwrap();
    let (code, out) = h.aptix(&["dead", "replay", id]);
    assert_eq!(code, 0, "{out}");
    let replayed = read(&h, &instance, 1).await;
    let last = replayed.iter().rfind(|r| r.is_final).unwrap();
    assert_eq!(last.body["Successful"], true, "{}", last.body);
    let queue = h.topology.session_queue(&s.parse().unwrap());
    assert!(!queue_exists(&h, &queue).await, "no session queue is made: {queue}");
    let _ = ch.queue_delete(instance.as_str().into(), Default::default()).await;
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_instance_queue_gets_its_reply_kept_and_its_deltas_dropped() {
    let h = Harness::start(1).await;
    // A backend that named its queue in reply_to without declaring it (or deleted it).
    let instance = format!("{}.instance.gone", h.topology.prefix());
    let s = new_session();
    let mut request = user_turn(&s, "t0", "go");
    request["Stream"] = json!(true);
    publish_with_reply_to(&h, &request, &instance).await;
    // Deltas go out during the model call, before the reply: once the reply is kept, every
    // delta was handled.
    let unrouted = h.topology.unrouted();
    let deadline = tokio::time::Instant::now() + WAIT;
    while h.peek_count(&unrouted).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the reply never reached {unrouted}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = h.take_all(&unrouted).await;
    let replies = kept.iter().filter(|(_, body)| {
        serde_json::from_slice::<Value>(body).is_ok_and(|b| b.get("Successful").is_some())
    });
    assert_eq!(replies.count(), 1, "the reply is kept for the operator");
    assert_eq!(kept.len(), 1, "no delta is kept beside it: {} messages", kept.len());
    assert!(!queue_exists(&h, &instance).await, "an instance queue is never made here");
    h.teardown().await;
}
