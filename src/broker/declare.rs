//! Declaring the pipeline's own exchanges and queues: the request entry exchange and the ingress
//! layout behind it, stage queues (with their partitions), delay, dead-letter and unrouted
//! queues, on classic or quorum queues.
//!
//! Every argument here is one the pipeline relies on; each carries its reason. Quorum queues get
//! the features the pipeline uses on a cluster: at-least-once dead-lettering (which RabbitMQ only
//! honours together with `reject-publish` overflow, silently falling back to at-most-once
//! otherwise) and a delivery limit as a backstop behind the runtime's own redelivery count.

use lapin::options::{ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use super::topology::durable_queue;
use super::{Topology, RETRY_TIERS_MS};
use crate::config::QueueType;

/// Deliveries of one message a quorum queue allows before dead-lettering it. A backstop: the
/// runtime dead-letters poison after `pipeline.max_redeliveries` (checked in PostgreSQL, at most
/// 32), and requeues on shutdown or partition hand-over count too, so it sits well above that.
pub const QUORUM_DELIVERY_LIMIT: i64 = 64;

/// What a queue is for, which decides its arguments.
#[derive(Clone, Copy)]
enum Role {
    /// An ingress partition: one active consumer keeps a session's requests in order.
    Ingress,
    /// A stage queue.
    Work,
    /// A stage queue's partition: one of several that exist to spread a stage over a cluster.
    Partition,
    /// A retry delay tier: messages wait `ttl_ms`, then return to their stage queue.
    Delay { ttl_ms: u64 },
    /// Where messages end for an operator (dead letters, unrouted replies).
    Sink,
}

impl Topology {
    /// Declares everything except session queues: the entry exchange and this topology's ingress
    /// layout, the other stage queues of [`Topology::with_stages`], delay tiers, the dead-letter
    /// and unrouted queues and the replies exchange. Idempotent; safe from every worker.
    pub async fn declare(&self, ch: &Channel) -> Result<(), lapin::Error> {
        self.declare_ingress(ch).await?;
        self.declare_downstream(ch).await
    }

    /// What [`Topology::declare`] declares, except the ingress layout and the entry exchange's
    /// binding to it. Stages after the ingress declare this, so that a worker started with an
    /// outdated `amqp.ingress_partitions` can never route requests to a layout no validate
    /// worker consumes.
    pub async fn declare_downstream(&self, ch: &Channel) -> Result<(), lapin::Error> {
        self.declare_entry(ch).await?;
        for &stage in self.stages().iter().skip(1) {
            self.queue(ch, &self.stage_queue(stage), Role::Work).await?;
            self.declare_stage_partitions(ch, stage).await?;
        }
        self.queue(ch, &self.dead(), Role::Sink).await?;
        self.queue(ch, &self.unrouted(), Role::Sink).await?;
        exchange(ch, &self.replies_exchange(), ExchangeKind::Direct).await?;
        for tier in RETRY_TIERS_MS {
            self.declare_delay_tier(ch, tier).await?;
        }
        Ok(())
    }

    /// The entry exchange alone, where clients publish.
    pub async fn declare_entry(&self, ch: &Channel) -> Result<(), lapin::Error> {
        // Topic, bound with `#`: every routing key (the SessionId) reaches the ingress layout,
        // and the layout behind it can change without clients noticing.
        exchange(ch, &self.requests_exchange(), ExchangeKind::Topic).await
    }

    /// The ingress queues, and the entry exchange's binding to them: straight to the single
    /// queue, or through a consistent-hash exchange that sends each SessionId to one partition.
    async fn declare_ingress(&self, ch: &Channel) -> Result<(), lapin::Error> {
        self.declare_entry(ch).await?;
        let queues = self.ingress_queues();
        for queue in &queues {
            self.queue(ch, queue, Role::Ingress).await?;
        }
        if self.is_draining() {
            return Ok(());
        }
        if self.partitions() <= 1 {
            return bind_queue(ch, &queues[0], &self.requests_exchange(), "#").await;
        }
        let hash = self.partition_exchange(self.partitions());
        exchange(ch, &hash, ExchangeKind::Custom("x-consistent-hash".into())).await?;
        for queue in &queues {
            // The binding key is the partition's weight on the hash ring: all equal.
            bind_queue(ch, queue, &hash, "1").await?;
        }
        ch.exchange_bind(
            hash.as_str().into(),
            self.requests_exchange().into(),
            "#".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
    }

    /// `stage`'s partitions, if any, behind its consistent-hash exchange (`stage_partitions`),
    /// and those of the layouts being drained: consuming them must not fail on a queue an
    /// operator already deleted.
    async fn declare_stage_partitions(
        &self,
        ch: &Channel,
        stage: super::StageName,
    ) -> Result<(), lapin::Error> {
        for layout in self.stage_layouts(stage) {
            let hash = &layout.exchange;
            exchange(ch, hash, ExchangeKind::Custom("x-consistent-hash".into())).await?;
            for queue in &layout.queues {
                self.queue(ch, queue, Role::Partition).await?;
                // Equal weights on the hash ring, as for the ingress.
                bind_queue(ch, queue, hash, "1").await?;
            }
        }
        Ok(())
    }

    async fn declare_delay_tier(&self, ch: &Channel, tier: u64) -> Result<(), lapin::Error> {
        let name = self.delay_exchange(tier);
        exchange(ch, &name, ExchangeKind::Fanout).await?;
        self.queue(ch, &name, Role::Delay { ttl_ms: tier }).await?;
        bind_queue(ch, &name, &name, "").await
    }

    /// Declares `name` as a queue where messages end for an operator (a tenant's dead-letter or
    /// unrouted queue, made on its first message).
    pub async fn declare_sink(&self, ch: &Channel, name: &str) -> Result<(), lapin::Error> {
        self.queue(ch, name, Role::Sink).await
    }

    async fn queue(&self, ch: &Channel, name: &str, role: Role) -> Result<(), lapin::Error> {
        durable_queue(ch, name, self.arguments(role)).await
    }

    fn arguments(&self, role: Role) -> FieldTable {
        let mut args = FieldTable::default();
        let mut set = |k: &str, v: AMQPValue| {
            args.insert(k.into(), v);
        };
        let quorum = self.queue_type() == QueueType::Quorum;
        if quorum {
            // Replicated over the cluster's nodes: losing one node loses no message.
            set("x-queue-type", AMQPValue::LongString("quorum".into()));
        }
        match role {
            Role::Ingress => {
                // One consumer at a time receives (the others stand by), so a session's
                // requests are admitted in the order they were published.
                set("x-single-active-consumer", AMQPValue::Boolean(true));
            }
            Role::Delay { ttl_ms } => {
                // A fixed TTL per tier, so expiry is FIFO.
                set("x-message-ttl", AMQPValue::LongLongInt(ttl_ms as i64));
                // Expired messages return through the default exchange under their original
                // routing key, which is the stage queue's name.
                set("x-dead-letter-exchange", AMQPValue::LongString("".into()));
            }
            Role::Partition if quorum => {
                // RabbitMQ 3.10 puts a new leader on the declaring connection's node
                // (`client-local`): one worker declares every partition, so they would all be
                // led by one node, which is what partitions are for to avoid.
                set("x-queue-leader-locator", AMQPValue::LongString("balanced".into()));
            }
            Role::Work | Role::Partition | Role::Sink => {}
        }
        if quorum && matches!(role, Role::Ingress | Role::Work | Role::Partition) {
            // A message that keeps crashing its consumer ends in the dead-letter queue.
            set("x-delivery-limit", AMQPValue::LongLongInt(QUORUM_DELIVERY_LIMIT));
            set("x-dead-letter-exchange", AMQPValue::LongString("".into()));
            set("x-dead-letter-routing-key", AMQPValue::LongString(self.dead().into()));
        }
        if quorum
            && matches!(role, Role::Ingress | Role::Work | Role::Partition | Role::Delay { .. })
        {
            // Dead-lettering that cannot lose a message in flight (retries and poison alike).
            set("x-dead-letter-strategy", AMQPValue::LongString("at-least-once".into()));
            // At-least-once dead-lettering is only honoured with this overflow behaviour.
            set("x-overflow", AMQPValue::LongString("reject-publish".into()));
        }
        args
    }
}

async fn exchange(ch: &Channel, name: &str, kind: ExchangeKind) -> Result<(), lapin::Error> {
    let options = ExchangeDeclareOptions { durable: true, ..Default::default() };
    crate::metrics::metrics().amqp("exchange.declare");
    ch.exchange_declare(name.into(), kind, options, FieldTable::default()).await
}

async fn bind_queue(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), lapin::Error> {
    let options = QueueBindOptions::default();
    crate::metrics::metrics().amqp("queue.bind");
    ch.queue_bind(queue.into(), exchange.into(), key.into(), options, FieldTable::default()).await
}
