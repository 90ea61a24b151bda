//! An ordered message (a session's turn at validate) whose outputs cannot be published stays
//! where it is: the worker handles it again in place until it can publish them, and the next
//! message of its key, which the worker already holds, waits behind it. A nack would put it
//! behind that message.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aptix::broker::{
    run_stage, Delivery, Disposition, Handler, OutMessage, RuntimeSettings, StageName,
};
use aptix::config::QueueType;
use futures_util::future::BoxFuture;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// Gives `m1` up (a dead letter), forwards nothing for the rest, and keeps the order it was
/// called in. The first call waits for a permit, so the test can take the dead-letter queue
/// away while the worker holds both messages.
struct GivingUpFirst {
    seen: Arc<Mutex<Vec<String>>>,
    redeliveries: AtomicU32,
    arrived: mpsc::UnboundedSender<()>,
    go: Arc<Semaphore>,
}

impl Handler for GivingUpFirst {
    fn handle(&self, d: Delivery) -> BoxFuture<'_, Disposition> {
        Box::pin(async move {
            let id = d.message_id.unwrap_or_default();
            let first = {
                let mut seen = self.seen.lock().unwrap();
                seen.push(id.clone());
                seen.len() == 1
            };
            if first {
                let _ = self.arrived.send(());
                self.go.acquire().await.unwrap().forget();
            }
            if id == "m1" {
                let reason = "unusable".to_owned();
                return Disposition::DeadLetter { reason, messages: vec![] };
            }
            Disposition::forward(vec![])
        })
    }

    fn exhausted(&self, _: Delivery, _: String) -> BoxFuture<'_, Vec<OutMessage>> {
        Box::pin(async { vec![] })
    }

    fn ordering_key(&self, _: &Delivery) -> Option<String> {
        Some("one-session".to_owned())
    }

    fn count_redelivery(&self, _: &Delivery) -> BoxFuture<'_, Result<Option<u32>, String>> {
        let count = self.redeliveries.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move { Ok(Some(count)) })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_outputs_cannot_be_published_is_not_overtaken_by_the_next() {
    let layout = (1, QueueType::Classic);
    let common::Declared { topology, publisher, conn, ingress } =
        common::declared(layout, &["m1", "m2"]).await;
    let settings = RuntimeSettings {
        // Both messages at once: m2 waits in the worker, behind m1 in its key's lane.
        prefetch: 4,
        // Every attempt after the first counts as a redelivery: m1 is handled three times, then
        // given up as poison without being handled again.
        max_redeliveries: 2,
        ..common::runtime_settings(&topology)
    };
    let (tx, mut arrived) = mpsc::unbounded_channel();
    let (seen, go) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Semaphore::new(0)));
    let handler = GivingUpFirst {
        seen: seen.clone(),
        redeliveries: AtomicU32::new(0),
        arrived: tx,
        go: go.clone(),
    };
    let shutdown = CancellationToken::new();
    let stage: StageName = aptix::stages::names()[0];
    let worker = tokio::spawn(run_stage(stage, Arc::new(handler), settings, shutdown.clone()));
    tokio::time::timeout(Duration::from_secs(30), arrived.recv()).await.unwrap();

    // Without the dead-letter queue, m1's dead letter is unroutable: its publish fails.
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(topology.dead().as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    go.add_permits(1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    topology.declare(publisher.channel()).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let handled_m2 = seen.lock().unwrap().iter().any(|id| id == "m2");
        if handled_m2 && depth(&conn, &topology.dead()).await == Some(1) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "seen {:?}", seen.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = seen.lock().unwrap().clone();
    let m2 = seen.iter().position(|id| id == "m2").unwrap();
    assert!(seen[m2 + 1..].is_empty(), "m2 was handled before m1 was settled: {seen:?}");
    assert_eq!(seen, ["m1", "m1", "m1", "m2"], "handled again in place, up to the poison count");
    let dead = ch.basic_get(topology.dead().as_str().into(), BasicGetOptions { no_ack: true });
    let dead = dead.await.unwrap().unwrap();
    let reason =
        aptix::broker::header_text(dead.delivery.properties.headers().as_ref(), "x-aptix-reason");
    assert!(reason.unwrap_or_default().starts_with("poison"), "dead-lettered as poison");
    assert_eq!(depth(&conn, &ingress).await, Some(0));
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap();
    common::delete_topology(&ch, &topology, &[]).await;
}
