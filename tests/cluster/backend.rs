//! A backend as `docs/client-protocol.md` §4 describes it for a RabbitMQ cluster: connected to
//! one node (here, the node the test kills), it declares and consumes its sessions' reply queues
//! there, so they live on that node; when its connection is lost it connects again to another
//! node, with a back-off, and declares and consumes its queues again, which fails while their
//! node is down and succeeds once it is back.

use std::time::{Duration, Instant};

use aptix::broker::Topology;
use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use lapin::Connection;

use super::Inbox;

/// Reads `sessions`' reply queues into `inbox` until the test ends, starting on `urls[first]`.
pub fn spawn(
    urls: Vec<String>,
    first: usize,
    topology: Topology,
    sessions: Vec<String>,
    inbox: Inbox,
) {
    tokio::spawn(async move {
        let mut node = first;
        let mut pause = Duration::from_millis(200);
        loop {
            match consume_all(&urls[node % urls.len()], &topology, &sessions, &inbox).await {
                Ok(conn) => {
                    pause = Duration::from_millis(200);
                    while conn.status().connected() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    eprintln!("backend on node {}: connection lost", node % urls.len() + 1);
                }
                Err(error) => eprintln!("backend: {error}; trying another node"),
            }
            node += 1;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    });
}

/// Connects to `url`, declares and consumes every session's queue; the connection, or why not.
async fn consume_all(
    url: &str,
    topology: &Topology,
    sessions: &[String],
    inbox: &Inbox,
) -> Result<Connection, String> {
    let conn = aptix::broker::connect(url).await.map_err(|e| e.to_string())?;
    for s in sessions {
        let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
        let id = s.parse().unwrap();
        if let Err(e) = topology.declare_client_queue(&ch, &id).await {
            let _ = conn.close(200, "queue not available".into()).await;
            return Err(format!("declare {s}: {e}"));
        }
        let queue = topology.session_queue(&id);
        let options = BasicConsumeOptions::default();
        let consume =
            ch.basic_consume(queue.as_str().into(), "".into(), options, FieldTable::default());
        let consumer = consume.await.map_err(|e| e.to_string())?;
        collect(ch, consumer, s.clone(), inbox.clone());
    }
    Ok(conn)
}

/// Acks each message `consumer` delivers and notes it in `inbox` under `session`, until the
/// channel (kept open meanwhile) ends.
pub fn collect(ch: lapin::Channel, mut consumer: lapin::Consumer, session: String, inbox: Inbox) {
    tokio::spawn(async move {
        let _keep = ch;
        while let Some(Ok(d)) = consumer.next().await {
            let _ = d.ack(BasicAckOptions::default()).await;
            let reply = crate::common::reply_of(&d);
            inbox.lock().unwrap().entry(session.clone()).or_default().push((Instant::now(), reply));
        }
    });
}
