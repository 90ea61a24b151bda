//! The client protocol as docs/client-protocol.md gives it, against the real broker and
//! database: a client that declares its reply queue (durable, no arguments) and publishes to the
//! entry exchange gets every reply once and in order, with typed headers; refusals are stored
//! and create nothing for a session that does not exist; a reply whose queue the client deleted
//! is kept in `<prefix>.unrouted`.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{new_session, user_turn, Harness};
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn header<'a>(d: &'a lapin::message::Delivery, key: &str) -> Option<&'a AMQPValue> {
    d.properties.headers().as_ref().and_then(|t| t.inner().get(key))
}

async fn stored_refusals(h: &Harness, session: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT to_jsonb(r) FROM replies r WHERE session_id = $1::uuid ORDER BY created_at",
    )
    .bind(session)
    .fetch_all(h.deps.store.pool())
    .await
    .unwrap()
}

async fn queue_exists(h: &Harness, queue: &str) -> bool {
    let ch = h.conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    ch.queue_declare(queue.into(), passive, FieldTable::default()).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_documented_path_gets_typed_headers_on_the_first_reply() {
    let h = Harness::start(1).await;
    let s = new_session();
    // The client declares its queue and never binds it: the server does.
    h.submit(&user_turn(&s, "t1", "hello")).await;
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.session_queue(&s.parse().unwrap());
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d = tokio::time::timeout(WAIT, consumer.next()).await.unwrap().unwrap().unwrap();
    d.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(d.properties.kind().as_ref().map(|k| k.as_str()), Some("reply"));
    assert_eq!(header(&d, "x-aptix-final"), Some(&AMQPValue::Boolean(true)));
    assert_eq!(header(&d, "x-aptix-step"), Some(&AMQPValue::LongLongInt(0)));
    assert_eq!(header(&d, "x-aptix-outcome"), Some(&AMQPValue::LongString("final".into())));
    // The protocol's version (docs/client-protocol.md §1a).
    assert_eq!(header(&d, "x-aptix-protocol"), Some(&AMQPValue::LongLongInt(3)));
    let id = d.properties.message_id().as_ref().unwrap().to_string();
    assert_eq!(id, format!("reply:{s}:t1:step-0"));
    let body: Value = serde_json::from_slice(&d.data).unwrap();
    assert_eq!(body["Successful"], true, "{body}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_sessions_of_five_turns_published_at_once_get_every_reply_once_in_order() {
    let h = Harness::start(2).await;
    let sessions: Vec<String> = (0..20).map(|_| new_session()).collect();
    // Sessions publish concurrently, each its turns in order: the first replies of the new
    // sessions race each other, which is where returns used to be charged to the wrong publish.
    let publish = |s: &String| {
        let (h, s) = (&h, s.clone());
        async move {
            for t in 1..=5 {
                h.submit(&user_turn(&s, &format!("t{t}"), "go")).await;
            }
        }
    };
    futures_util::future::join_all(sessions.iter().map(publish)).await;
    let all = futures_util::future::join_all(sessions.iter().map(|s| h.replies(s, 5, WAIT))).await;
    for (s, replies) in sessions.iter().zip(all) {
        let finals: Vec<&str> =
            replies.iter().filter(|r| r.is_final).map(|r| r.turn_id.as_str()).collect();
        assert_eq!(finals, ["t1", "t2", "t3", "t4", "t5"], "session {s}: {replies:?}");
        let mut ids: Vec<&str> = replies.iter().map(|r| r.message_id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), replies.len(), "no duplicates: {ids:?}");
    }
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_for_an_unknown_session_creates_no_queue_and_is_stored() {
    let h = Harness::start(1).await;
    let s = new_session();
    // Not declared, as a careless or hostile client would: nothing may be left behind.
    h.publish_raw(json!({"SessionId": s, "TurnId": "bad"}).to_string().into_bytes()).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while stored_refusals(&h, &s).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the refusal was never stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = stored_refusals(&h, &s).await;
    assert_eq!(stored[0]["outcome"], "refused");
    assert_eq!(stored[0]["body"]["Errors"][0]["Code"], "validation.instruction_missing");
    assert!(!queue_exists(&h, &h.topology.session_queue(&s.parse().unwrap())).await);
    // It is kept where an operator sees it instead of being dropped. It is stored first and
    // published after the commit, so it may arrive a moment after the row is seen.
    let ch = h.conn.create_channel().await.unwrap();
    let unrouted = h.topology.unrouted();
    let mut got = None;
    while got.is_none() && tokio::time::Instant::now() < deadline {
        let opts = BasicGetOptions { no_ack: true };
        got = ch.basic_get(unrouted.as_str().into(), opts).await.unwrap();
        if got.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let kept = got.expect("the refusal in the unrouted queue");
    assert_eq!(
        kept.delivery.properties.message_id().as_ref().unwrap().as_str(),
        stored[0]["message_id"]
    );
    // An ordinary turn of another session is answered at once.
    let other = new_session();
    h.submit(&user_turn(&other, "t1", "hi")).await;
    assert_eq!(h.replies(&other, 1, WAIT).await.len(), 1);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_reach_a_declared_queue_and_a_deleted_queue_sends_them_to_unrouted() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&json!({"SessionId": s, "TurnId": "a"})).await;
    let reply = h.replies(&s, 1, WAIT).await.pop().expect("a refusal");
    assert_eq!(reply.headers["x-aptix-outcome"], "refused");
    assert_eq!(reply.headers["x-aptix-final"], "true");
    let stored = stored_refusals(&h, &s).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["body"], reply.body, "the stored copy is what the client received");
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.session_queue(&s.parse().unwrap());
    ch.queue_delete(queue.as_str().into(), Default::default()).await.unwrap();
    h.publish_raw(json!({"SessionId": s, "TurnId": "b"}).to_string().into_bytes()).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let kept = loop {
        let got =
            ch.basic_get(h.topology.unrouted().as_str().into(), BasicGetOptions { no_ack: true });
        if let Some(m) = got.await.unwrap() {
            break m;
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing reached the unrouted queue");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let routing_key = header(&kept.delivery, "x-aptix-unrouted-routing-key");
    assert_eq!(routing_key, Some(&AMQPValue::LongString(s.clone().into())));
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replies_to_a_submission_carry_its_message_id_as_correlation_id() {
    let h = Harness::start(1).await;
    let s = new_session();
    let sid = s.parse().unwrap();
    h.topology.declare_client_queue(h.publisher.channel(), &sid).await.unwrap();
    h.sessions.lock().unwrap().insert(sid);
    let refused = json!({"SessionId": s, "TurnId": "a"}).to_string().into_bytes();
    h.publisher.publish(&h.topology.request(&s, "client-m1".into(), refused)).await.unwrap();
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.session_queue(&sid);
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d = tokio::time::timeout(WAIT, consumer.next()).await.unwrap().unwrap().unwrap();
    d.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(d.properties.correlation_id().as_ref().map(|c| c.as_str()), Some("client-m1"));
    assert_eq!(header(&d, "x-aptix-outcome"), Some(&AMQPValue::LongString("refused".into())));
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn internal_headers_set_by_a_client_are_dropped_at_ingress() {
    let h = Harness::start(1).await;
    let mut msg = h.topology.request("-", "forged".into(), br#"{"TurnId":"x"}"#.to_vec());
    msg = msg.header("x-aptix-attempt", "4294967295").header("x-aptix-redeliveries", "7");
    h.publisher.publish(&msg).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let dead = loop {
        let dead = h.dead_letters().await;
        if !dead.is_empty() {
            break dead;
        }
        assert!(tokio::time::Instant::now() < deadline, "no dead letter");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let headers: &HashMap<String, String> = &dead[0].0;
    assert!(!headers.contains_key("x-aptix-attempt"), "{headers:?}");
    assert!(!headers.contains_key("x-aptix-redeliveries"), "{headers:?}");
    assert!(headers["x-aptix-reason"].contains("SessionId"));
    h.teardown().await;
}

/// A turn's reply whose publish failed waits in the outbox for its persist message to come
/// again; a next turn of the session admitted meanwhile must not overtake it (seen in the
/// cluster failover test). Admission publishes such replies before the new turn starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpublished_reply_goes_out_before_the_next_turn_starts() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "first")).await;
    let first = h.replies(&s, 1, WAIT).await.pop().expect("t1's reply");
    // As if persist had committed this reply a while ago and lost its publish with the
    // connection (a fresh one is left to persist: the new turn waits for it instead).
    let sid: aptix::contracts::SessionId = s.parse().unwrap();
    let late = aptix::messages::ReplyOut::resent(sid, "t1", "lost", first.body.clone());
    let payload = serde_json::to_value(aptix::messages::Outgoing::Reply(late)).unwrap();
    sqlx::query(
        "INSERT INTO outbox (session_id, turn_id, payload, created_at)
         VALUES ($1::uuid, 't1', $2, now() - interval '1 minute')",
    )
    .bind(&s)
    .bind(&payload)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
    h.submit(&user_turn(&s, "t2", "second")).await;
    let replies = h.replies(&s, 2, WAIT).await;
    let order: Vec<&str> = replies.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(order, [format!("reply:{s}:t1:resent-lost"), format!("reply:{s}:t2:step-0")]);
    // t2's first try at starting saw the row and wrote nothing: counted once, in sequence.
    let (seqs, next_seq): (Vec<i64>, i64) = sqlx::query_as(
        "SELECT (SELECT array_agg(seq ORDER BY seq) FROM turns WHERE session_id = $1::uuid),
                (SELECT next_seq FROM sessions WHERE id = $1::uuid)",
    )
    .bind(&s)
    .fetch_one(h.deps.store.pool())
    .await
    .unwrap();
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    assert_eq!((seqs[1], next_seq), (seqs[0] + 1, seqs[0] + 2), "{seqs:?} then {next_seq}");
    // Published rows are deleted once confirmed (in the background).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.deps.store.outbox_len().await.unwrap() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "published outbox rows are deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.teardown().await;
}
