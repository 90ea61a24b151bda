//! What the broker says about the pipeline's queues, for `aptix status`: messages ready and
//! consumers of each, read with passive declares (which create nothing).

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
            let counts = super::layout::passive_counts(publisher, &queue).await?;
            let (ready, consumers) = counts.unwrap_or_default();
            out.push(QueueState { queue, stage, exists: counts.is_some(), ready, consumers });
        }
        Ok(out)
    }
}
