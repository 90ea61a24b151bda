//! An ordered message (a session's turn at validate) whose outputs cannot be published stays
//! where it is: the worker publishes them again in place until they go, and the next message
//! of its key, which the worker already holds, waits behind it. A nack would put it
//! behind that message. The broker's failure spends none of the stage's attempts.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aptix::broker::{
    run_stage, Delivery, Disposition, Handler, OutMessage, RuntimeSettings, StageName,
};
use aptix::config::QueueType;
use futures_util::future::BoxFuture;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// What the handler does with `m1`.
#[derive(Clone)]
enum First {
    /// Gives it up: a dead letter.
    GiveUp,
    /// Forwards one message to this queue.
    ForwardTo(String),
    /// Forwards this reply, then one message to this queue.
    ReplyThenForwardTo(Box<OutMessage>, String),
}

/// Treats `m1` as `first` says, forwards nothing for the rest, and keeps the order it was called
/// in, with each call's attempt number. The first call waits for a permit, so the test can take
/// a queue away while the worker holds both messages.
struct Recording {
    first: First,
    seen: Arc<Mutex<Vec<(String, u32)>>>,
    redeliveries: Arc<AtomicU32>,
    arrived: mpsc::UnboundedSender<()>,
    go: Arc<Semaphore>,
    /// Replies parked (refused by their client's queue), counted as `park` is asked.
    parked: Arc<AtomicU32>,
}

impl Handler for Recording {
    fn handle(&self, d: Delivery) -> BoxFuture<'_, Disposition> {
        Box::pin(async move {
            let id = d.message_id.unwrap_or_default();
            let first = {
                let mut seen = self.seen.lock().unwrap();
                seen.push((id.clone(), d.attempt));
                seen.len() == 1
            };
            if first {
                let _ = self.arrived.send(());
                self.go.acquire().await.unwrap().forget();
            }
            match (&self.first, id.as_str()) {
                (First::GiveUp, "m1") => {
                    let reason = "unusable".to_owned();
                    Disposition::DeadLetter { reason, messages: vec![] }
                }
                (First::ForwardTo(queue), "m1") => {
                    let out = OutMessage::to_queue(queue.clone(), "turn", id, b"{}".to_vec());
                    Disposition::forward(vec![out])
                }
                (First::ReplyThenForwardTo(reply, queue), "m1") => {
                    let out = OutMessage::to_queue(queue.clone(), "turn", id, b"{}".to_vec());
                    Disposition::forward(vec![(**reply).clone(), out])
                }
                _ => Disposition::forward(vec![]),
            }
        })
    }

    fn exhausted(&self, _: Delivery, _: String) -> BoxFuture<'_, Vec<OutMessage>> {
        Box::pin(async { vec![] })
    }

    fn ordering_key(&self, _: &Delivery) -> Option<String> {
        Some("one-session".to_owned())
    }

    fn count_redelivery(
        &self,
        _: &Delivery,
    ) -> BoxFuture<'_, Result<Option<u32>, aptix::broker::BoxError>> {
        let count = self.redeliveries.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move { Ok(Some(count)) })
    }

    fn park(
        &self,
        refused: Vec<aptix::broker::Refused>,
    ) -> BoxFuture<'_, Result<(), aptix::broker::ParkError>> {
        let n = u32::try_from(refused.len()).unwrap();
        self.parked.fetch_add(n, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// A worker consuming the first stage with a `Recording` handler.
struct Running {
    seen: Arc<Mutex<Vec<(String, u32)>>>,
    redeliveries: Arc<AtomicU32>,
    parked: Arc<AtomicU32>,
    go: Arc<Semaphore>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts the worker and waits until it holds `m1` (and, with prefetch, `m2`).
    async fn start(first: First, settings: RuntimeSettings) -> Running {
        let (tx, mut arrived) = mpsc::unbounded_channel();
        let (seen, go) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Semaphore::new(0)));
        let (redeliveries, parked) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let handler = Recording {
            first,
            seen: seen.clone(),
            redeliveries: redeliveries.clone(),
            arrived: tx,
            go: go.clone(),
            parked: parked.clone(),
        };
        let shutdown = CancellationToken::new();
        let stage: StageName = aptix::stages::names()[0];
        let task = tokio::spawn(run_stage(stage, Arc::new(handler), settings, shutdown.clone()));
        tokio::time::timeout(Duration::from_secs(30), arrived.recv()).await.unwrap();
        Running { seen, redeliveries, parked, go, shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await.unwrap().unwrap();
    }
}

/// Messages in `queue`, or `None` while it does not exist.
async fn depth(conn: &lapin::Connection, queue: &str) -> Option<u32> {
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let d = ch.queue_declare(queue.into(), passive, FieldTable::default()).await.ok()?;
    let _ = ch.close(200, "done".into()).await;
    Some(d.message_count())
}

/// Which queue is gone for 4 s, so which publish of `m1` the broker refuses.
#[derive(Clone, Copy)]
enum Gone {
    /// The dead-letter queue: `m1` is given up, and its dead letter is unroutable.
    Dead,
    /// The next stage's queue: `m1` is forwarded there, and its output is unroutable.
    Next,
}

/// What the outage did to `m1`.
struct Outage {
    seen: Vec<(String, u32)>,
    redeliveries: u32,
    /// Messages in the next stage's queue and in the dead-letter queue afterwards.
    next: Option<u32>,
    dead: Option<u32>,
    dead_reason: Option<String>,
}

/// Runs a worker holding `m1` and `m2` of one key (both at once: `m2` waits in the worker,
/// behind `m1` in its key's lane) while the `gone` queue is missing for 4 s, until `m2` was
/// handled and `m1` forwarded or dead-lettered.
async fn queue_gone_for_4s(gone: Gone, max_attempts: u32) -> Outage {
    let common::Declared { topology, publisher, conn, ingress } =
        common::declared((1, QueueType::Classic), &["m1", "m2"]).await;
    let next = topology.stage_queue(aptix::stages::names()[1]);
    let (first, missing) = match gone {
        Gone::Dead => (First::GiveUp, topology.dead()),
        Gone::Next => (First::ForwardTo(next.clone()), next.clone()),
    };
    let settings =
        RuntimeSettings { prefetch: 4, max_attempts, ..common::runtime_settings(&topology) };
    let worker = Running::start(first, settings).await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(missing.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    worker.go.add_permits(1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    topology.declare(publisher.channel()).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let handled_m2 = || worker.seen.lock().unwrap().iter().any(|(id, _)| id == "m2");
    let (mut next_depth, mut dead) = (None, None);
    while !handled_m2() || next_depth.max(dead) < Some(1) {
        assert!(tokio::time::Instant::now() < deadline, "seen {:?}", worker.seen.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
        (next_depth, dead) = (depth(&conn, &next).await, depth(&conn, &topology.dead()).await);
    }
    let get = ch.basic_get(topology.dead().as_str().into(), BasicGetOptions { no_ack: true });
    let dead_reason = get.await.unwrap().and_then(|m| {
        aptix::broker::header_text(m.delivery.properties.headers().as_ref(), "x-aptix-reason")
    });
    assert_eq!(depth(&conn, &ingress).await, Some(0));
    let outage = Outage {
        seen: worker.seen.lock().unwrap().clone(),
        redeliveries: worker.redeliveries.load(Ordering::SeqCst),
        next: next_depth,
        dead,
        dead_reason,
    };
    worker.stop().await;
    common::delete_topology(&ch, &topology, &[]).await;
    outage
}

/// `m1` then `m2`, each handled once, at its first attempt.
fn m1_then_m2() -> [(String, u32); 2] {
    [("m1".to_owned(), 0), ("m2".to_owned(), 0)]
}

/// A turn being given up whose dead letter the broker refuses publishes it again in place: the
/// handler runs once, no redelivery is counted (4 s of tries would exceed `max_redeliveries` 3
/// and make `m1` "poison"), and `m2` waits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_outputs_cannot_be_published_is_not_overtaken_by_the_next() {
    let outage = queue_gone_for_4s(Gone::Dead, 3).await;
    assert_eq!(outage.seen, m1_then_m2(), "m1 handled once, then m2");
    assert_eq!(outage.redeliveries, 0);
    assert_eq!((outage.next, outage.dead), (Some(0), Some(1)), "m1 dead-lettered");
    let reason = outage.dead_reason.as_deref();
    assert_eq!(reason, Some("unusable"), "dead-lettered for what the handler said");
}

/// A publish outage is the broker's failure, not the turn's: the same output is published
/// again in place until it goes, spending none of the stage's attempts and counting no crash
/// redelivery. With 4 attempts, the tiers used to run `m1` again at attempts 1 and 2 (0.5 s and
/// 2.5 s in), then wait 10 s: a node loss nacks publishes for seconds, and that tier held the
/// session's lane well past the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_turn_rides_out_a_publish_outage_without_spending_its_attempts() {
    // The tiers of 4 attempts last 0.5 + 2 + 10 s, longer than the outage.
    let outage = queue_gone_for_4s(Gone::Next, 4).await;
    assert_eq!(outage.seen, m1_then_m2(), "m1 handled once, at its first attempt, then m2");
    assert_eq!(outage.redeliveries, 0, "a refused publish counted as a crash redelivery");
    assert_eq!((outage.next, outage.dead), (Some(1), Some(0)), "m1 forwarded, not given up");
}

/// A refusal that outlasts the stage's retry tiers is not an outage (a deleted queue): the turn
/// is given up then, with an error reply and a dead letter, as its tiers would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_refused_for_longer_than_the_tiers_last_gives_the_turn_up() {
    // The tiers of 2 attempts last 0.5 s.
    let outage = queue_gone_for_4s(Gone::Next, 2).await;
    assert_eq!(outage.seen, m1_then_m2(), "m1 handled once, then m2 after it was given up");
    assert_eq!((outage.next, outage.dead), (Some(0), Some(1)), "m1 given up");
    let reason = outage.dead_reason.unwrap_or_default();
    assert!(reason.starts_with("retries exhausted: publish failed"), "reason {reason:?}");
}

/// A delivery's outputs published again in place while the next stage's queue is gone for 4 s:
/// the reply among them, which its client's queue refuses (it takes no message), is parked
/// once, not at every try (each try parked another copy, filling the queue's 1,000 waiting
/// replies with one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_reply_is_parked_once_however_often_the_rest_is_published_again() {
    use aptix::contracts::{ReplyAddress, SessionId};
    let common::Declared { topology, publisher, conn, .. } =
        common::declared((1, QueueType::Classic), &["m1"]).await;
    let session = SessionId::new(uuid::Uuid::new_v4());
    let queue = topology.session_queue(&session);
    let mut args = FieldTable::default();
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    let ch = conn.create_channel().await.unwrap();
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    ch.queue_declare(queue.as_str().into(), durable, args).await.unwrap();
    let id = format!("reply:{session}:t1:step-0");
    let mut reply = OutMessage::to_queue(String::new(), "reply", id, b"{}".to_vec());
    reply.exchange = topology.replies_exchange();
    reply.session = Some(session);
    let reply = Box::new(reply.to(&ReplyAddress::default()));
    let next = topology.stage_queue(aptix::stages::names()[1]);
    // The tiers of 4 attempts last 0.5 + 2 + 10 s, longer than the outage.
    let settings =
        RuntimeSettings { prefetch: 4, max_attempts: 4, ..common::runtime_settings(&topology) };
    let worker = Running::start(First::ReplyThenForwardTo(reply, next.clone()), settings).await;
    ch.queue_delete(next.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    worker.go.add_permits(1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    topology.declare(publisher.channel()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while depth(&conn, &next).await < Some(1) {
        assert!(tokio::time::Instant::now() < deadline, "m1's output never went");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(worker.parked.load(Ordering::SeqCst), 1, "parked once");
    worker.stop().await;
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    common::delete_topology(&ch, &topology, &[]).await;
}
