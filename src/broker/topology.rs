//! Queue and exchange names under the configured prefix, and their declaration.
//!
//! Every queue is a durable classic queue: quorum queues fsync every message and cannot be
//! created per session, and one node gains nothing from replication. Bounds and expiry of
//! session, dead-letter and unrouted queues come from RabbitMQ policies
//! (`deploy/rabbitmq/`), never from `x-` arguments: a client declaring its reply queue then
//! needs no server setting, and an operator changes a bound without redeclaring anything.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::contracts::SessionId;

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

/// Names of every queue and exchange, derived from one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    /// The pipeline's stages in order; the first consumes the ingress queue.
    stages: std::sync::Arc<[StageName]>,
}

impl Topology {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Topology { prefix: prefix.to_owned(), stages: std::sync::Arc::new([]) }
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

    /// The ingress queue, consumed by the validate stage. It shares its name with the entry
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

    /// A session's reply queue.
    pub fn session_queue(&self, session: &SessionId) -> String {
        format!("{}.session.{}", self.prefix, session)
    }

    /// Dead-letter queue.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// Fanout exchange of a retry delay tier.
    pub fn delay_exchange(&self, tier_ms: u64) -> String {
        format!("{}.delay.{tier_ms}", self.prefix)
    }

    /// Declares everything except session queues: the ingress queue and entry exchange always,
    /// the other stage queues of [`Topology::with_stages`]. Idempotent; safe from every worker.
    pub async fn declare(&self, ch: &Channel) -> Result<(), lapin::Error> {
        let mut ingress = FieldTable::default();
        // One ingress consumer at a time receives (the others stand by), so turns of a session
        // are admitted in the order they were published.
        ingress.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        durable_queue(ch, &self.requests(), ingress).await?;
        for &stage in self.stages.iter().skip(1) {
            durable_queue(ch, &self.stage_queue(stage), FieldTable::default()).await?;
        }
        self.declare_entry(ch).await?;
        durable_queue(ch, &self.dead(), FieldTable::default()).await?;
        durable_queue(ch, &self.unrouted(), FieldTable::default()).await?;
        ch.exchange_declare(
            self.replies_exchange().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
        for tier in RETRY_TIERS_MS {
            self.declare_delay_tier(ch, tier).await?;
        }
        Ok(())
    }

    async fn declare_entry(&self, ch: &Channel) -> Result<(), lapin::Error> {
        // Topic, bound with `#`: every routing key (the SessionId) reaches the ingress today,
        // and a partitioning exchange can be bound behind it later without clients noticing.
        ch.exchange_declare(
            self.requests_exchange().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
        ch.queue_bind(
            self.requests().into(),
            self.requests_exchange().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
    }

    async fn declare_delay_tier(&self, ch: &Channel, tier: u64) -> Result<(), lapin::Error> {
        let exchange = self.delay_exchange(tier);
        ch.exchange_declare(
            exchange.clone().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(tier as i64));
        // Expired messages return through the default exchange under their original routing
        // key, which is the stage queue's name.
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        durable_queue(ch, &exchange, args).await?;
        ch.queue_bind(
            exchange.clone().into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
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
        ch.queue_bind(
            self.session_queue(session).into(),
            self.replies_exchange().into(),
            session.to_string().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
    }
}

async fn durable_queue(ch: &Channel, name: &str, args: FieldTable) -> Result<(), lapin::Error> {
    ch.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
        .await
        .map(|_| ())
}
