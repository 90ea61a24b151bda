//! Queue and exchange names under the configured prefix, and session reply queues. The
//! pipeline's own queues are declared in `declare`.
//!
//! Session reply queues are always durable classic queues with no arguments: a quorum queue per
//! session costs about three times the memory on each of its nodes and declares three times
//! slower. Bounds and expiry of session, dead-letter and unrouted queues come from RabbitMQ
//! policies (`deploy/rabbitmq/`), never from `x-` arguments: a client declaring its reply queue
//! then needs no server setting, and an operator changes a bound without redeclaring anything.

use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::Channel;

use crate::config::QueueType;
use crate::contracts::{InstanceName, SessionId, TenantName};

/// A stage's name: its queue suffix, configuration key, metric label and worker name. Names come
/// from the stages themselves (`Stage::NAME`); the broker only carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageName(&'static str);

impl StageName {
    /// The name `name`.
    pub const fn new(name: &'static str) -> Self {
        StageName(name)
    }

    /// The name as text.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for StageName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Delay tiers for retries, in milliseconds. A message waits in the tier's queue (fixed TTL,
/// so expiry is FIFO) and is dead-lettered back to its stage queue.
pub const RETRY_TIERS_MS: [u64; 4] = [500, 2_000, 10_000, 30_000];

/// The delay (ms) before attempt `attempt + 1`: its tier, the last one for every later attempt.
pub fn retry_tier_ms(attempt: u32) -> u64 {
    RETRY_TIERS_MS[(attempt as usize).min(RETRY_TIERS_MS.len() - 1)]
}

/// Names of every queue and exchange, derived from one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    /// The pipeline's stages in order; the first consumes the ingress queue.
    stages: std::sync::Arc<[StageName]>,
    /// Ingress partitions (a power of two; 1 is the single ingress queue).
    partitions: u16,
    /// Partitions of each stage queue after the ingress (1: its single queue alone).
    pub(super) stage_partitions: u16,
    /// Earlier stage partition counts whose queues are still declared and consumed, so that
    /// what workers of an earlier setting left there is drained.
    pub(super) draining_stage_partitions: std::sync::Arc<[u16]>,
    /// The kind of the pipeline's own queues.
    queue_type: QueueType,
    /// Declaring leaves the entry exchange's bindings alone (draining an old ingress layout).
    draining: bool,
}

impl Topology {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Topology {
            prefix: prefix.to_owned(),
            stages: std::sync::Arc::new([]),
            partitions: 1,
            stage_partitions: 1,
            draining_stage_partitions: std::sync::Arc::new([]),
            queue_type: QueueType::Classic,
            draining: false,
        }
    }

    /// The same names, for draining this ingress layout: declaring it never binds the entry
    /// exchange to it, so requests keep going to the layout that replaced it.
    pub fn draining(mut self) -> Self {
        self.draining = true;
        self
    }

    /// Whether this topology only drains its ingress layout.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// The same names, with `partitions` ingress partitions (a power of two, checked by the
    /// configuration) on queues of `queue_type`.
    pub fn with_layout(mut self, partitions: u16, queue_type: QueueType) -> Self {
        self.partitions = partitions.max(1);
        self.queue_type = queue_type;
        self
    }

    /// The number of ingress partitions.
    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// The kind of the pipeline's own queues.
    pub fn queue_type(&self) -> QueueType {
        self.queue_type
    }

    /// The ingress queues of a layout of `partitions` partitions, in partition order: the single
    /// ingress queue when 1, else `<prefix>.requests.p<P>.<i>`.
    pub fn ingress_queues_of(&self, partitions: u16) -> Vec<String> {
        if partitions <= 1 {
            return vec![self.requests()];
        }
        let width = (partitions - 1).to_string().len();
        (0..partitions)
            .map(|i| format!("{}.requests.p{partitions}.{i:0width$}", self.prefix))
            .collect()
    }

    /// This topology's ingress queues, in partition order.
    pub fn ingress_queues(&self) -> Vec<String> {
        self.ingress_queues_of(self.partitions)
    }

    /// The consistent-hash exchange in front of a layout of `partitions` (> 1) partitions.
    pub fn partition_exchange(&self, partitions: u16) -> String {
        format!("{}.requests.p{partitions}", self.prefix)
    }

    /// The same names, for a pipeline of `stages` in order (the first consumes the ingress).
    pub fn with_stages(mut self, stages: &[StageName]) -> Self {
        self.stages = stages.into();
        self
    }

    /// The pipeline's stages in order.
    pub fn stages(&self) -> &[StageName] {
        &self.stages
    }

    /// Whether `stage` consumes the ingress queue (the pipeline's first stage).
    pub fn is_ingress(&self, stage: StageName) -> bool {
        self.stages.first() == Some(&stage)
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The single ingress queue (one partition), consumed by the validate stage. It shares its name with the entry
    /// exchange ([`Topology::requests_exchange`]) bound to it, so messages published by older
    /// clients straight to the queue still arrive.
    pub fn requests(&self) -> String {
        format!("{}.requests", self.prefix)
    }

    /// The entry point: clients publish requests here, routing key = SessionId.
    pub fn requests_exchange(&self) -> String {
        format!("{}.requests", self.prefix)
    }

    /// A request as a client publishes it: to the entry exchange, routing key = SessionId.
    pub fn request(&self, session: &str, message_id: String, body: Vec<u8>) -> super::OutMessage {
        let mut m = super::OutMessage::to_queue(session.to_owned(), "request", message_id, body);
        m.exchange = self.requests_exchange();
        m
    }

    /// Replies that could not be routed to their session's queue (the client deleted it).
    pub fn unrouted(&self) -> String {
        format!("{}.unrouted", self.prefix)
    }

    /// Where `tenant`'s unrouted replies are kept: a queue of its own (`P.unrouted.<tenant>`),
    /// so its bound evicts only that tenant's; [`Topology::unrouted`] without a tenant.
    pub fn unrouted_of(&self, tenant: Option<&TenantName>) -> String {
        match tenant {
            Some(t) => format!("{}.unrouted.{t}", self.prefix),
            None => self.unrouted(),
        }
    }

    /// Whether `queue` is a queue of a stage after the ingress (its single queue or one of its
    /// partitions): the queues whose messages only the pipeline writes, and which therefore
    /// carry a MAC (`mac`).
    pub fn is_inner_stage_queue(&self, queue: &str) -> bool {
        self.inner_stage_of_queue(queue).is_some()
    }

    /// The queue a stage consumes.
    pub fn stage_queue(&self, stage: StageName) -> String {
        if self.is_ingress(stage) {
            return self.requests();
        }
        format!("{}.{}", self.prefix, stage.as_str())
    }

    /// Direct exchange for replies, routing key = SessionId.
    pub fn replies_exchange(&self) -> String {
        format!("{}.replies", self.prefix)
    }

    /// A session's reply queue (single-tenant).
    pub fn session_queue(&self, session: &SessionId) -> String {
        self.session_queue_of(None, session)
    }

    /// A session's reply queue: `<prefix>.session.<SessionId>`, or with a tenant
    /// `<prefix>.session.<tenant>.<SessionId>`, which the tenant's user alone may read.
    pub fn session_queue_of(&self, tenant: Option<&TenantName>, session: &SessionId) -> String {
        format!("{}.session.{}", self.prefix, Self::session_key(tenant, session))
    }

    /// The routing key of a session's replies on the replies exchange.
    pub fn session_key(tenant: Option<&TenantName>, session: &SessionId) -> String {
        match tenant {
            Some(t) => format!("{t}.{session}"),
            None => session.to_string(),
        }
    }

    /// A backend instance's reply queue: the replies of every submission that named it in
    /// `reply_to` (docs/client-protocol.md); with a tenant, `<prefix>.instance.<tenant>.<name>`.
    /// Declared by its client, bound by the server.
    pub fn instance_queue(&self, tenant: Option<&TenantName>, instance: &InstanceName) -> String {
        match tenant {
            Some(t) => format!("{}.instance.{t}.{instance}", self.prefix),
            None => format!("{}.instance.{instance}", self.prefix),
        }
    }

    /// The routing key of an instance's replies on the replies exchange; never a session's (a
    /// UUID has no `.`, and `instance.<UUID>` of a tenant called `instance` has one dot where
    /// an instance key with a tenant has two).
    pub fn instance_key(tenant: Option<&TenantName>, instance: &InstanceName) -> String {
        match tenant {
            Some(t) => format!("instance.{t}.{instance}"),
            None => format!("instance.{instance}"),
        }
    }

    /// Dead-letter queue of messages no tenant is known for (a publisher in no tenant, a
    /// message that is not the pipeline's own, the broker's own dead-lettering).
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// Where `tenant`'s dead letters are kept: a queue of its own (`P.dead.<tenant>`), so a
    /// flood of one tenant's evicts only its own (the queue's bound is a policy's);
    /// [`Topology::dead`] without a tenant.
    pub fn dead_of(&self, tenant: Option<&TenantName>) -> String {
        match tenant {
            Some(t) => format!("{}.dead.{t}", self.prefix),
            None => self.dead(),
        }
    }

    /// The dead-letter queues an operator looks at for `tenants`: the shared one first.
    pub fn dead_queues<'a>(
        &self,
        tenants: impl IntoIterator<Item = &'a TenantName>,
    ) -> Vec<String> {
        let own = tenants.into_iter().map(|t| self.dead_of(Some(t)));
        std::iter::once(self.dead()).chain(own).collect()
    }

    /// Fanout exchange of a retry delay tier.
    pub fn delay_exchange(&self, tier_ms: u64) -> String {
        format!("{}.delay.{tier_ms}", self.prefix)
    }

    /// Declares a session's reply queue (durable, no arguments: what a client declares too) and
    /// binds it; idempotent.
    pub async fn declare_session(
        &self,
        ch: &Channel,
        session: &SessionId,
    ) -> Result<(), lapin::Error> {
        let queue = self.session_queue(session);
        durable_queue(ch, &queue, FieldTable::default()).await?;
        self.bind_session(ch, session).await
    }

    /// Declares a tenant's session reply queue and binds it; idempotent (the benchmarks, which
    /// run with a user allowed to bind).
    pub async fn declare_session_of(
        &self,
        ch: &Channel,
        tenant: Option<&TenantName>,
        session: &SessionId,
    ) -> Result<(), lapin::Error> {
        let queue = self.session_queue_of(tenant, session);
        durable_queue(ch, &queue, FieldTable::default()).await?;
        self.bind_reply_queue(ch, &queue, &Self::session_key(tenant, session)).await
    }

    /// What a client does before publishing a session's first request (docs/client-protocol.md):
    /// declares the reply queue, durable and with no arguments. The server binds it.
    pub async fn declare_client_queue(
        &self,
        ch: &Channel,
        session: &SessionId,
    ) -> Result<(), lapin::Error> {
        durable_queue(ch, &self.session_queue(session), FieldTable::default()).await
    }

    /// Binds a session's existing reply queue to the replies exchange.
    pub async fn bind_session(
        &self,
        ch: &Channel,
        session: &SessionId,
    ) -> Result<(), lapin::Error> {
        self.bind_reply_queue(ch, &self.session_queue(session), &session.to_string()).await
    }

    /// Binds an existing reply queue to the replies exchange under `key`.
    pub(super) async fn bind_reply_queue(
        &self,
        ch: &Channel,
        queue: &str,
        key: &str,
    ) -> Result<(), lapin::Error> {
        crate::metrics::metrics().amqp("queue.bind");
        ch.queue_bind(
            queue.into(),
            self.replies_exchange().into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
    }
}

pub(super) async fn durable_queue(
    ch: &Channel,
    name: &str,
    args: FieldTable,
) -> Result<(), lapin::Error> {
    crate::metrics::metrics().amqp("queue.declare");
    ch.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
        .await
        .map(|_| ())
}
