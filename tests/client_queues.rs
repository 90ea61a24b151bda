//! A reply queue belongs to its client: whatever its arguments, state or node do to a reply
//! costs the pipeline nothing (docs/reliability.md, "Client-owned queues"). A queue that refuses
//! every reply (`x-overflow = reject-publish`, `x-max-length = 0`) neither holds the ingress for
//! other sessions nor stops its own session; its replies wait in PostgreSQL and arrive, in
//! order, once the queue takes messages again.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::{new_session, user_turn, Harness, ReplyMsg};
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};

/// Declares the session's reply queue as a hostile client would: it takes no message at all.
pub(crate) async fn declare_refusing_queue(h: &Harness, session: &str) -> String {
    let queue = format!("{}.session.{session}", h.topology.prefix());
    let mut args = FieldTable::default();
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    let ch = h.conn.create_channel().await.unwrap();
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(queue.as_str().into(), options, args).await.unwrap();
    h.sessions.lock().unwrap().insert(session.parse().unwrap());
    queue
}

/// Replaces the refusing queue by a plain one, as the docs say a client declares it, and reads
/// it until `count` messages arrived or `wait` passed.
async fn mend_and_read(h: &Harness, queue: &str, count: usize, wait: Duration) -> Vec<ReplyMsg> {
    mend_queue(h, queue).await;
    let session = queue.rsplit('.').next().unwrap();
    let (_ch, mut consumer) = h.consume_replies(session).await;
    let deadline = tokio::time::Instant::now() + wait;
    let mut out = Vec::new();
    while out.len() < count {
        let Ok(Some(Ok(d))) = tokio::time::timeout_at(deadline, consumer.next()).await else {
            break;
        };
        d.ack(BasicAckOptions::default()).await.unwrap();
        out.push(common::reply_of(&d));
    }
    out
}

/// Replaces the refusing queue by a plain one, as the docs say a client declares it.
pub(crate) async fn mend_queue(h: &Harness, queue: &str) {
    let ch = h.conn.create_channel().await.unwrap();
    ch.queue_delete(queue.into(), QueueDeleteOptions::default()).await.unwrap();
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(queue.into(), options, FieldTable::default()).await.unwrap();
}

async fn parked(h: &Harness) -> i64 {
    h.deps.store.parked_len().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_that_refuses_every_refusal_does_not_hold_the_ingress_for_anyone() {
    let h = Harness::start(1).await;
    let hostile = new_session();
    let queue = declare_refusing_queue(&h, &hostile).await;
    // 64 invalid requests (no TurnId): each is answered with a refusal its queue rejects.
    for _ in 0..64 {
        let body = serde_json::json!({ "SessionId": hostile, "Instruction": "x" });
        h.publish_raw(serde_json::to_vec(&body).unwrap()).await;
    }
    let other = new_session();
    let started = Instant::now();
    h.submit(&user_turn(&other, "t1", "hello")).await;
    let replies = h.replies(&other, 1, Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(replies.iter().any(|r| r.is_final), "the other session got no reply in {took:?}");
    // Before this containment it took 45 s and more; the bound is the reply's own work plus one
    // refused offer (5 s at most), with room for a slow machine.
    assert!(took < Duration::from_secs(15), "the other session waited {took:?}");
    assert!(parked(&h).await > 0, "the refused refusals are parked in PostgreSQL");
    assert!(h.dead_letters().await.is_empty(), "a refused reply is no dead letter");

    // Once the queue takes messages, every refusal arrives, each once, in publish order.
    let refusals = mend_and_read(&h, &queue, 64, Duration::from_secs(60)).await;
    assert_eq!(refusals.len(), 64, "refusals delivered after the queue was mended");
    for r in &refusals {
        assert_eq!(r.headers.get("x-aptix-outcome").map(String::as_str), Some("refused"));
    }
    let mut ids: Vec<&str> = refusals.iter().map(|r| r.message_id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 64, "no copies");
    let deadline = Instant::now() + Duration::from_secs(10);
    while parked(&h).await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(parked(&h).await, 0, "nothing is left parked once delivered");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_whose_queue_refuses_its_replies_moves_on_and_gets_them_in_order_later() {
    let h = Harness::start(1).await;
    let session = new_session();
    let queue = declare_refusing_queue(&h, &session).await;
    for t in ["t1", "t2", "t3"] {
        h.publish_raw(serde_json::to_vec(&user_turn(&session, t, "hello")).unwrap()).await;
    }
    // Every turn runs and completes although no reply can be delivered.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut states: Vec<String> = Vec::new();
    while Instant::now() < deadline {
        states =
            sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1::uuid ORDER BY seq")
                .bind(&session)
                .fetch_all(h.deps.store.pool())
                .await
                .unwrap();
        if states.len() == 3 && states.iter().all(|s| s == "completed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(states, ["completed"; 3], "the session moved on past its refused replies");
    assert_eq!(h.records(&session).await.len(), 3, "one record per turn");
    assert!(h.dead_letters().await.is_empty(), "no message was given up");
    assert_eq!(h.deps.store.outbox_len().await.unwrap(), 0, "nothing waits in the outbox");

    let replies = mend_and_read(&h, &queue, 3, Duration::from_secs(60)).await;
    let turns: Vec<&str> = replies.iter().map(|r| r.turn_id.as_str()).collect();
    assert_eq!(turns, ["t1", "t2", "t3"], "the parked replies arrive once, in order");
    assert!(replies.iter().all(|r| r.is_final));
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parked_replies_are_bounded_per_queue_and_per_tenant() {
    let h = Harness::start(0).await;
    let store = &h.deps.store;
    // A tenant at its bound, over 20 queues of 500; another with one queue at its own bound.
    sqlx::query(
        "INSERT INTO undelivered (queue, tenant, message, reason)
         SELECT 'q' || (i % 20), 'greedy', '{}'::jsonb, 'test' FROM generate_series(1, $1) AS i
         UNION ALL SELECT 'full', 'other', '{}'::jsonb, 'test' FROM generate_series(1, $2)",
    )
    .bind(aptix::store::MAX_PARKED_PER_TENANT)
    .bind(aptix::store::MAX_PARKED_PER_QUEUE)
    .execute(store.pool())
    .await
    .unwrap();
    let reply = |queue: &str, tenant: &str| aptix::store::ParkReply {
        queue: queue.into(),
        session: None,
        tenant: Some(tenant.into()),
        instance: false,
        message: serde_json::json!({}),
        reason: "test".into(),
    };
    assert_eq!(store.park_replies(&[reply("q-new", "greedy")]).await.unwrap(), 1, "tenant bound");
    assert_eq!(store.park_replies(&[reply("full", "other")]).await.unwrap(), 1, "queue bound");
    assert_eq!(store.park_replies(&[reply("fresh", "other")]).await.unwrap(), 0, "room elsewhere");
    // An instance's queue serves many sessions: it may hold its tenant's whole bound.
    let to_instance = aptix::store::ParkReply { instance: true, ..reply("full", "other") };
    assert_eq!(store.park_replies(&[to_instance]).await.unwrap(), 0, "an instance's queue");
    h.teardown().await;
}

/// A reply queue that dead-letters what it holds into the entry point (its client may publish
/// there, so RabbitMQ lets it name `P.requests` as its dead-letter exchange) sends the
/// pipeline's replies back to the ingress. They are dropped there unanswered: answered, each
/// would come back again, for ever, through validate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replies_a_queue_dead_letters_into_the_ingress_are_dropped_there_unanswered() {
    let h = Harness::start(1).await;
    let s = new_session();
    let queue = format!("{}.session.{s}", h.topology.prefix());
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(0));
    let requests = h.topology.requests_exchange();
    args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(requests.into()));
    let ch = h.conn.create_channel().await.unwrap();
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(queue.as_str().into(), options, args).await.unwrap();
    h.sessions.lock().unwrap().insert(s.parse().unwrap());
    let mut turn = user_turn(&s, "t1", "hello");
    turn["Stream"] = true.into();
    h.publish_raw(serde_json::to_vec(&turn).unwrap()).await;
    let state = "SELECT state FROM turns WHERE session_id = $1::uuid AND turn_id = 't1'";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: Option<String> =
            sqlx::query_scalar(state).bind(&s).fetch_optional(h.deps.store.pool()).await.unwrap();
        if now.as_deref() == Some("completed") {
            break;
        }
        assert!(Instant::now() < deadline, "the turn is {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its deltas and reply came back to validate meanwhile; let the last of them arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answered = "SELECT count(*) FROM replies WHERE session_id = $1::uuid";
    let answered: i64 =
        sqlx::query_scalar(answered).bind(&s).fetch_one(h.deps.store.pool()).await.unwrap();
    assert_eq!(answered, 0, "validate answered the pipeline's own messages");
    assert!(h.dead_letters().await.is_empty(), "nothing to dead-letter either");
    assert!(h.take_all(&h.topology.ingress_queues()[0]).await.is_empty(), "nothing loops");
    h.teardown().await;
}

/// The redelivery loop claims each tenant's waiting heads in turn: one tenant with more
/// refusing queues than a claim takes does not hold back another tenant's reply, nor does one
/// whose share of the loop's offers is in flight. A reply parked again (its delivery handled
/// again) is not parked twice.
#[tokio::test]
async fn parked_replies_are_claimed_each_tenants_in_turn() {
    use crate::store_support::{drop_database, fresh_store};
    use aptix::store::ParkReply;
    let (store, db) = fresh_store().await;
    let reply = |tenant: &str, queue: String| ParkReply {
        message: serde_json::json!({ "message_id": format!("reply:{queue}") }),
        queue,
        session: None,
        tenant: Some(tenant.to_owned()),
        instance: false,
        reason: "refused".into(),
    };
    let many: Vec<ParkReply> = (0..70).map(|i| reply("greedy", format!("q-greedy-{i}"))).collect();
    assert_eq!(store.park_replies(&many).await.unwrap(), 0);
    assert_eq!(store.park_replies(&[reply("other", "q-other".into())]).await.unwrap(), 0);
    assert_eq!(store.park_replies(&[reply("other", "q-other".into())]).await.unwrap(), 0);
    assert_eq!(store.parked_len().await.unwrap(), 71, "parked once");
    let claimed = store.claim_parked(64, 64, &[]).await.unwrap();
    assert_eq!(claimed.len(), 64);
    let other = claimed.iter().find(|p| p.queue == "q-other").expect("the other tenant's reply");
    assert_eq!(other.tenant.as_deref(), Some("other"));
    // A tenant gets no more claimed than its share of the loop's offers less those in flight,
    // in one claim as across them.
    assert_eq!(store.claim_parked(16, 4, &[]).await.unwrap().len(), 4);
    assert_eq!(store.claim_parked(16, 4, &[("greedy".into(), 2)]).await.unwrap().len(), 2);
    assert!(store.claim_parked(16, 4, &[("greedy".into(), 4)]).await.unwrap().is_empty());
    drop_database(store, &db).await;
}

/// A parked reply this version cannot read (a newer version wrote it, or it is corrupt) is
/// offered again as soon as a refused one, for a worker that reads it, instead of holding its
/// queue's later replies for a day; one no worker read in a day is kept in the unrouted queue
/// as stored, and leaves its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_parked_reply_is_offered_again_soon_and_kept_aside_after_a_day() {
    let h = Harness::start(1).await;
    let pool = h.deps.store.pool();
    sqlx::query(
        r#"INSERT INTO undelivered (queue, message, reason, created_at) VALUES
           ('q-fresh', '{"v": 99}', 'test', now()),
           ('q-old', '{"v": 99, "message_id": "old"}', 'test', now() - interval '25 hours')"#,
    )
    .execute(pool)
    .await
    .unwrap();
    let fresh = "SELECT tries, extract(epoch FROM next_try_at - now())::float8 FROM undelivered
                 WHERE queue = 'q-fresh'";
    let deadline = Instant::now() + Duration::from_secs(30);
    let (tries, due_in) = loop {
        let (tries, due_in): (i32, f64) = sqlx::query_as(fresh).fetch_one(pool).await.unwrap();
        let old: i64 = sqlx::query_scalar("SELECT count(*) FROM undelivered WHERE queue = 'q-old'")
            .fetch_one(pool)
            .await
            .unwrap();
        if tries >= 2 && old == 0 {
            break (tries, due_in);
        }
        assert!(Instant::now() < deadline, "fresh offered {tries} times, old rows {old}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(due_in <= 10.5, "offered again in {due_in} s after {tries} offers");
    let kept = h.take_all(&h.topology.unrouted()).await;
    assert_eq!(kept.len(), 1, "the old one is kept aside once");
    let (headers, body) = &kept[0];
    assert_eq!(serde_json::from_slice::<serde_json::Value>(body).unwrap()["v"], 99);
    assert_eq!(headers.get("x-aptix-unrouted-routing-key").map(String::as_str), Some("q-old"));
    h.teardown().await;
}
