//! Handing an ingress partition over, observed from the broker: a worker that gives a partition
//! up (its share changed, or it stops), or stops consuming the single ingress queue, keeps the
//! queue's single active subscription until the message it is handling is settled. Only then does a standby consumer start, at the next
//! message. A consumer that started earlier would overtake that message: a session's turn
//! admitted before the one published ahead of it.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aptix::broker::{
    run_partitioned, run_stage, Delivery, Disposition, Handler, OutMessage, RuntimeSettings,
    StageName, Topology,
};
use aptix::config::QueueType;
use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;

/// Reports each message it is given and finishes one only when the test adds a permit.
struct Holding {
    arrived: mpsc::UnboundedSender<String>,
    finish: Arc<Semaphore>,
}

impl Handler for Holding {
    fn handle(&self, d: Delivery) -> BoxFuture<'_, Disposition> {
        Box::pin(async move {
            let _ = self.arrived.send(d.message_id.unwrap_or_default());
            self.finish.acquire().await.unwrap().forget();
            Disposition::forward(vec![])
        })
    }

    fn exhausted(&self, _: Delivery, _: String) -> BoxFuture<'_, Vec<OutMessage>> {
        Box::pin(async { vec![] })
    }
}

/// A worker consuming partition 0 of a fresh layout of `partitions` `queue_type` queues,
/// holding its first message. One partition is the single ingress queue, consumed without a
/// share (`run_stage`).
struct Setup {
    conn: Connection,
    topology: Topology,
    queue: String,
    share: watch::Sender<BTreeSet<u16>>,
    shutdown: CancellationToken,
    arrived: mpsc::UnboundedReceiver<String>,
    finish: Arc<Semaphore>,
    worker: tokio::task::JoinHandle<()>,
}

async fn holding_partition_zero(layout: (u16, QueueType), messages: &[&str]) -> Setup {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rabbitmq/setup.sh");
    let status = std::process::Command::new("bash").arg(script).arg("--dev").status().unwrap();
    assert!(status.success(), "deploy/rabbitmq/setup.sh failed");
    let common::Declared { topology, conn, ingress: queue, .. } =
        common::declared(layout, messages).await;
    // One message at a time: the next one waits in the queue, where a consumer the broker
    // activated too early would get it.
    let settings = RuntimeSettings { prefetch: 1, ..common::runtime_settings(&topology) };
    let (tx, mut arrived) = mpsc::unbounded_channel();
    let finish = Arc::new(Semaphore::new(0));
    let handler: Arc<dyn Handler> = Arc::new(Holding { arrived: tx, finish: finish.clone() });
    let (share, rx) = watch::channel(BTreeSet::from([0]));
    let shutdown = CancellationToken::new();
    let stage: StageName = aptix::stages::names()[0];
    let worker = if layout.0 > 1 {
        tokio::spawn(run_partitioned(stage, handler, settings, rx, shutdown.clone()))
    } else {
        tokio::spawn(run_stage(stage, handler, settings, shutdown.clone()))
    };
    let first = tokio::time::timeout(Duration::from_secs(30), arrived.recv()).await.unwrap();
    assert_eq!(first.as_deref(), Some(messages[0]));
    Setup { conn, topology, queue, share, shutdown, arrived, finish, worker }
}

/// A consumer waiting behind the worker's subscription on `queue`.
async fn standby(conn: &Connection, queue: &str) -> lapin::Consumer {
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    let options = BasicConsumeOptions { no_ack: true, ..Default::default() };
    ch.basic_consume(queue.into(), "standby".into(), options, FieldTable::default()).await.unwrap()
}

async fn next_id(consumer: &mut lapin::Consumer, limit: Duration) -> Option<String> {
    let next = tokio::time::timeout(limit, consumer.next()).await.ok()??;
    next.unwrap().properties.message_id().as_ref().map(ToString::to_string)
}

/// Gives partition 0 up by `give_up` while its first message is being handled, and checks that
/// the standby gets nothing until that message is settled, then the rest in order.
async fn hand_over(layout: (u16, QueueType), give_up: impl FnOnce(&Setup)) {
    let mut s = holding_partition_zero(layout, &["m1", "m2", "m3"]).await;
    let mut other = standby(&s.conn, &s.queue).await;
    give_up(&s);
    // After a cancel, RabbitMQ 3.10 delivers to the standby at once from a quorum queue, and from
    // a classic one at the queue's next event: a request arriving, as they do under load.
    tokio::time::sleep(Duration::from_millis(300)).await;
    common::publish_ids(&s.conn, &s.queue, &["m4"]).await;
    // Long enough for a delivery, which takes milliseconds on this broker.
    let early = next_id(&mut other, Duration::from_millis(1500)).await;
    assert_eq!(early, None, "the standby started while m1 was still being handled");
    s.finish.add_permits(1);
    for id in ["m2", "m3", "m4"] {
        assert_eq!(next_id(&mut other, Duration::from_secs(30)).await.as_deref(), Some(id));
    }
    assert!(s.arrived.try_recv().is_err(), "the worker took more than m1");
    s.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), s.worker).await.unwrap().unwrap();
    let ch = s.conn.create_channel().await.unwrap();
    common::delete_topology(&ch, &s.topology, &[]).await;
}

fn give_partition_up(s: &Setup) {
    s.share.send(BTreeSet::new()).unwrap();
}

fn stop(s: &Setup) {
    s.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_given_up_stays_held_until_its_message_is_settled() {
    hand_over((2, QueueType::Classic), give_partition_up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_holds_its_partitions_until_their_messages_are_settled() {
    hand_over((2, QueueType::Classic), stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_partition_given_up_stays_held_until_its_message_is_settled() {
    hand_over((2, QueueType::Quorum), give_partition_up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_holds_its_quorum_partitions_until_their_messages_are_settled() {
    hand_over((2, QueueType::Quorum), stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_holds_the_single_ingress_queue_until_its_message_is_settled() {
    hand_over((1, QueueType::Classic), stop).await;
    hand_over((1, QueueType::Quorum), stop).await;
}
