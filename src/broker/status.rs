//! What the broker says about the pipeline's queues, for `aptix status`: messages ready and
//! consumers of each, read with passive declares (which create nothing).

use serde::Serialize;

use super::management::ManagementError;
use super::{BrokerError, Publisher, Topology};
use crate::contracts::TenantName;

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
    /// Rates and the consuming workers, when the management API is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<super::management::Activity>,
}

impl Topology {
    /// Every ingress partition, every stage queue and partition (those of the layouts being
    /// drained too), the dead letters and unrouted replies, and
    /// those of each of `tenants` that has any queue of them yet (made by its first message).
    pub async fn queue_states(
        &self,
        publisher: &Publisher,
        tenants: &[TenantName],
    ) -> Result<Vec<QueueState>, BrokerError> {
        let ingress = self.stages().first().map(|s| s.as_str());
        let mut named: Vec<(String, Option<&'static str>)> =
            self.ingress_queues().into_iter().map(|q| (q, ingress)).collect();
        for stage in self.stages().iter().skip(1) {
            let queues = self.consumed_queues(*stage).into_iter();
            named.extend(queues.map(|q| (q, Some(stage.as_str()))));
        }
        named.push((self.dead(), None));
        named.push((self.unrouted(), None));
        let mut out = Vec::with_capacity(named.len());
        for (queue, stage) in named {
            let counts = super::layout::passive_counts(publisher, &queue).await?;
            let (ready, consumers) = counts.unwrap_or_default();
            let exists = counts.is_some();
            out.push(QueueState { queue, stage, exists, ready, consumers, activity: None });
        }
        for tenant in tenants {
            for queue in [self.dead_of(Some(tenant)), self.unrouted_of(Some(tenant))] {
                if let Some((ready, consumers)) =
                    super::layout::passive_counts(publisher, &queue).await?
                {
                    let exists = true;
                    out.push(QueueState {
                        queue,
                        stage: None,
                        exists,
                        ready,
                        consumers,
                        activity: None,
                    });
                }
            }
        }
        Ok(out)
    }
}

impl Topology {
    /// Why the broker cannot serve this layout although it answers: a plugin it lacks (the
    /// consistent-hash exchange, for ingress or stage partitions). Looked for by declaring a throwaway
    /// exchange of that type on a channel of its own, deleted at once.
    pub async fn missing_plugin(
        &self,
        publisher: &Publisher,
    ) -> Result<Option<String>, BrokerError> {
        let stage_layouts = self.stages().iter().any(|s| !self.stage_layouts(*s).is_empty());
        if self.partitions() <= 1 && !stage_layouts {
            return Ok(None);
        }
        let ch = publisher.scratch_channel().await?;
        let probe = format!("{}.plugin-probe.{}", self.prefix(), uuid::Uuid::new_v4().simple());
        let options =
            lapin::options::ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
        let kind = lapin::ExchangeKind::Custom("x-consistent-hash".into());
        let declared =
            ch.exchange_declare(probe.as_str().into(), kind, options, Default::default());
        match declared.await {
            Ok(()) => {
                let _ = ch.exchange_delete(probe.as_str().into(), Default::default()).await;
                let _ = ch.close(200, "probed".into()).await;
                Ok(None)
            }
            Err(e) => Ok(BrokerError::from(e).missing_plugin()),
        }
    }
}

/// Longest a look at the management API may take in all, so an unreachable API cannot hold up
/// `aptix status` or a console page for a request per queue.
const ACTIVITY_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// Adds what the management API says of each existing queue; stops at the first error (the
/// queues not reached yet keep none) or when [`ACTIVITY_BUDGET`] is spent.
pub async fn with_activity(
    states: &mut [QueueState],
    api: &super::management::Management,
) -> Result<(), ManagementError> {
    let look = async {
        let mut names = std::collections::HashMap::new();
        for q in states.iter_mut().filter(|q| q.exists) {
            q.activity = match api.activity(&q.queue).await? {
                Some(mut a) => {
                    name_workers(api, &mut a.workers, &mut names).await?;
                    Some(a)
                }
                None => None,
            };
        }
        Ok(())
    };
    match tokio::time::timeout(ACTIVITY_BUDGET, look).await {
        Ok(result) => result,
        Err(_) => Err(ManagementError::Timeout(ACTIVITY_BUDGET)),
    }
}

/// Replaces the broker's connection names in `workers` by the names the connections gave
/// themselves, asking once per connection.
async fn name_workers(
    api: &super::management::Management,
    workers: &mut [String],
    names: &mut std::collections::HashMap<String, String>,
) -> Result<(), ManagementError> {
    for w in workers.iter_mut() {
        if !names.contains_key(w.as_str()) {
            let own = api.connection_name(w).await?;
            names.insert(w.clone(), own);
        }
        *w = names[w.as_str()].clone();
    }
    Ok(())
}
