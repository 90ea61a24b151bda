//! Queue and exchange names under the configured prefix, and their declaration.
//!
//! Every queue is a durable classic queue: quorum queues fsync every message and cannot be
//! created per session, and one node gains nothing from replication.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::contracts::SessionId;

/// A pipeline stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StageName {
    /// Parse, check, and admit turns; consumes the ingress queue.
    Validate,
    /// Fill the `[CONTEXT]` block from the vector store.
    Retrieve,
    /// Build the `/responses` body.
    Assemble,
    /// Call the LLM.
    Invoke,
    /// Write the immutable record and publish the reply.
    Persist,
}

impl StageName {
    /// All stages in pipeline order.
    pub const ALL: [StageName; 5] = [
        StageName::Validate,
        StageName::Retrieve,
        StageName::Assemble,
        StageName::Invoke,
        StageName::Persist,
    ];

    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            StageName::Validate => "validate",
            StageName::Retrieve => "retrieve",
            StageName::Assemble => "assemble",
            StageName::Invoke => "invoke",
            StageName::Persist => "persist",
        }
    }
}

/// Delay tiers for retries, in milliseconds. A message waits in the tier's queue (fixed TTL,
/// so expiry is FIFO) and is dead-lettered back to its stage queue.
pub const RETRY_TIERS_MS: [u64; 4] = [500, 2_000, 10_000, 30_000];

/// Names of every queue and exchange, derived from one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    session_queue_expires_ms: u64,
}

impl Topology {
    /// Names under `prefix`; session reply queues expire after `session_queue_expires_ms` unused.
    pub fn new(prefix: &str, session_queue_expires_ms: u64) -> Self {
        Topology { prefix: prefix.to_owned(), session_queue_expires_ms }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Ingress queue where backends publish requests; consumed by the validate stage.
    pub fn requests(&self) -> String {
        format!("{}.requests", self.prefix)
    }

    /// The queue a stage consumes.
    pub fn stage_queue(&self, stage: StageName) -> String {
        match stage {
            StageName::Validate => self.requests(),
            other => format!("{}.{}", self.prefix, other.as_str()),
        }
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

    /// Arguments of a session reply queue; clients must declare it with exactly these.
    pub fn session_queue_args(&self) -> FieldTable {
        let mut args = FieldTable::default();
        // Unused session queues disappear; a reply is never the only copy (it is in Postgres).
        args.insert(
            ShortString::from("x-expires"),
            AMQPValue::LongLongInt(self.session_queue_expires_ms as i64),
        );
        args
    }

    /// Declares everything except session queues. Idempotent; safe from every worker.
    pub async fn declare(&self, ch: &Channel) -> Result<(), lapin::Error> {
        for stage in StageName::ALL {
            let mut args = FieldTable::default();
            if stage == StageName::Validate {
                // One validate consumer at a time receives (the others stand by), so turns of a
                // session are admitted in the order they were published.
                args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
            }
            durable_queue(ch, &self.stage_queue(stage), args).await?;
        }
        durable_queue(ch, &self.dead(), FieldTable::default()).await?;
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

    /// Declares a session's reply queue and binds it; idempotent.
    pub async fn declare_session(&self, ch: &Channel, session: &SessionId) -> Result<(), lapin::Error> {
        let queue = self.session_queue(session);
        durable_queue(ch, &queue, self.session_queue_args()).await?;
        ch.queue_bind(
            queue.into(),
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
