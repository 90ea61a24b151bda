//! What the broker says about the pipeline's queues, for `aptix status`: messages ready and
//! consumers of each, read with passive declares (which create nothing).

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde::Serialize;

use super::{BrokerError, Publisher, Topology};

/// One queue as the broker reports it.
#[derive(Debug, Clone, Serialize)]
pub struct QueueState {
    /// The queue.
    pub queue: String,
    /// The stage that consumes it (none for the dead letters and unrouted replies).
    pub stage: Option<&'static str>,
    /// Whether it exists.
    pub exists: bool,
    /// Messages ready (not delivered to a consumer).
    pub ready: u32,
    /// Consumers attached now.
    pub consumers: u32,
}

impl Topology {
    /// Every ingress partition, every stage queue, the dead letters and unrouted replies.
    pub async fn queue_states(
        &self,
        publisher: &Publisher,
    ) -> Result<Vec<QueueState>, BrokerError> {
        let ingress = self.stages().first().map(|s| s.as_str());
        let mut named: Vec<(String, Option<&'static str>)> =
            self.ingress_queues().into_iter().map(|q| (q, ingress)).collect();
        for stage in self.stages().iter().skip(1) {
            named.push((self.stage_queue(*stage), Some(stage.as_str())));
        }
        named.push((self.dead(), None));
        named.push((self.unrouted(), None));
        let mut out = Vec::with_capacity(named.len());
        for (queue, stage) in named {
            // A passive declare of a missing queue closes its channel: one channel per queue.
            let ch = publisher.scratch_channel().await?;
            let passive = QueueDeclareOptions { passive: true, ..Default::default() };
            let state =
                match ch.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await
                {
                    Ok(q) => {
                        let _ = ch.close(200, "read".into()).await;
                        QueueState {
                            queue,
                            stage,
                            exists: true,
                            ready: q.message_count(),
                            consumers: q.consumer_count(),
                        }
                    }
                    Err(e) if super::layout::is_not_found(&e) => {
                        QueueState { queue, stage, exists: false, ready: 0, consumers: 0 }
                    }
                    Err(e) => return Err(e.into()),
                };
            out.push(state);
        }
        Ok(out)
    }
}
