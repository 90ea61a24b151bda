//! The ceiling: a relay through five durable queues that does no work. Each relay stage
//! consumes one queue with the pipeline stage's prefetch and manual acks, publishes a message of
//! the size the real stage would publish (persistent, mandatory, waiting for the confirm) and
//! only then acks, exactly the delivery contract of the broker runtime. The last stage publishes
//! the reply to the session's queue through the replies exchange. Queue names come from a
//! [`Topology`] of its own, so the driver and the queue layout are the pipeline's.

use std::sync::Arc;

use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use aptix::broker::{connect, OutMessage, Publisher, Topology};

/// Message sizes in bytes: index 0 is the request, then what each stage but the last
/// publishes, and last the reply (one more than the pipeline has stages).
pub type HopSizes = Vec<usize>;

/// Starts one relay stage per pipeline stage; they run until `shutdown` fires.
pub async fn start(
    amqp_url: &str,
    topology: &Topology,
    sizes: HopSizes,
    prefetch: Vec<u16>,
    shutdown: CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    let stages = topology.stages().to_vec();
    for (i, stage) in stages.iter().enumerate() {
        let consume_conn = connect(amqp_url).await?;
        let publisher = Publisher::connect(amqp_url).await?;
        let channel = consume_conn.create_channel().await?;
        channel.basic_qos(prefetch[i].max(1), BasicQosOptions::default()).await?;
        let queue = topology.stage_queue(*stage);
        let mut consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let next = stages.get(i + 1).map(|s| topology.stage_queue(*s));
        let replies = topology.replies_exchange();
        // One padding buffer per stage, shared by every message it sends.
        let pad: Arc<Vec<u8>> = Arc::new(if next.is_some() {
            vec![b'x'; sizes[i + 1]]
        } else {
            let filler = sizes[stages.len()].saturating_sub(30);
            format!("{{\"Successful\":true,\"Pad\":\"{}\"}}", "x".repeat(filler)).into_bytes()
        });
        let token = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let delivery = tokio::select! {
                    _ = token.cancelled() => break,
                    d = consumer.next() => d,
                };
                let Some(Ok(d)) = delivery else { break };
                let (publisher, next, replies, pad) =
                    (publisher.clone(), next.clone(), replies.clone(), pad.clone());
                tokio::spawn(async move {
                    let header = |k: &str| {
                        d.properties
                            .headers()
                            .as_ref()
                            .and_then(|h| h.inner().get(k))
                            .and_then(AMQPValue::as_long_string)
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    };
                    let (session, turn) = (header("x-aptix-session-id"), header("x-aptix-turn-id"));
                    let msg = match next {
                        Some(q) => {
                            OutMessage::to_queue(q, "turn", format!("relay:{turn}"), pad.to_vec())
                        }
                        None => {
                            let mut m = OutMessage::to_queue(
                                session.clone(),
                                "reply",
                                format!("reply:{turn}"),
                                pad.to_vec(),
                            );
                            m.exchange = replies;
                            m.header("x-aptix-final", true)
                        }
                    }
                    .header("x-aptix-session-id", session)
                    .header("x-aptix-turn-id", turn);
                    match publisher.publish(&msg).await {
                        Ok(()) => {
                            let _ = d.acker.ack(BasicAckOptions::default()).await;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "relay publish failed; requeueing");
                            let _ = d
                                .acker
                                .nack(BasicNackOptions { requeue: true, ..Default::default() })
                                .await;
                        }
                    }
                });
            }
            let _ = channel.close(200, "relay done".into()).await;
            let _ = consume_conn.close(200, "relay done".into()).await;
            publisher.close(std::time::Duration::from_secs(5)).await;
        }));
    }
    Ok(tasks)
}
