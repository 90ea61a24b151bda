//! The one place that talks to RabbitMQ. Stages never see lapin: a [`Handler`] receives a
//! [`Delivery`] and answers with a [`Disposition`]; the runtime consumes, publishes with confirms,
//! acks only after the next hop confirmed, retries through delay queues, and dead-letters.

pub mod client;
mod dead;
mod declare;
mod delivery;
mod lanes;
mod layout;
pub mod management;
mod message;
mod offer_slots;
mod partitioned;
mod publish;
mod replies;
mod runtime;
mod settings;
mod settle;
mod spare;
mod stage_consumers;
mod stage_partitions;
mod status;
mod topology;
pub mod trace;
mod wind_down;

use std::collections::BTreeMap;

use crate::contracts::headers;
use futures_util::future::BoxFuture;

pub use crate::config::{MessageKeys, MIN_KEY_BYTES};

/// An error of a [`Handler`], whatever its type: the runtime logs it and decides by the call
/// that failed, never by its text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why replies a client's queue refused were not parked.
#[derive(Debug)]
pub enum ParkError {
    /// Worth waiting for: the database unreachable, restarting, read-only for a while.
    Transient(BoxError),
    /// Never to be parked (what the store refuses to hold): kept in `<prefix>.unrouted`.
    Permanent(BoxError),
}
pub use dead::{DeadAction, DeadLetter, Settled as DeadSettled, LISTED_BODY, MAX_LOOK};
pub use declare::QUORUM_DELIVERY_LIMIT;
/// The header that carries a stage message's MAC (hex): HMAC-SHA256 under the pipeline's keys
/// over `aptix.stage/v1`, the AMQP type, the stage queue and the body. Every message published to
/// a stage queue after the ingress carries one, and a stage consumer dead-letters a message
/// whose MAC does not verify before its stage sees it: a stage-shaped body a client got into a
/// stage queue (a replayed dead letter, a queue's dead-letter routing) is data, never an
/// instruction.
pub const MAC_HEADER: &str = headers::MAC;
/// What a stage message's MAC is over, before its body.
pub fn stage_mac_fields<'a>(kind: &'a str, queue: &'a str) -> [&'a str; 3] {
    ["aptix.stage/v1", kind, queue]
}
/// What the MAC of a copy the ingress republishes to itself (a redelivery's count, a retry
/// through a delay queue) is over, before its body: its counters, which the ingress otherwise
/// drops with a client's headers. A request that names no session is not ordered, so its
/// crash loop is bounded by this count alone on a classic ingress.
pub fn ingress_count_fields<'a>(attempt: &'a str, redeliveries: &'a str) -> [&'a str; 3] {
    ["aptix.ingress-count/v1", attempt, redeliveries]
}
pub use delivery::header_text;
pub use message::{HeaderValue, OutMessage};
pub use partitioned::run_partitioned;
pub use publish::Publisher;
pub use replies::{
    client_queue, keep_unrouted, set_waiting_queues, Handed, LazyPublisher, Refused, SessionQueues,
};
pub use runtime::{connect, process_one, run_stage, CLIENT_FRAME_MAX};
pub use settings::RuntimeSettings;
pub use settle::publish_all;
pub use stage_partitions::StageLayout;
pub use status::{with_activity, QueueState};
pub use topology::{retry_tier_ms, StageName, Topology, RETRY_TIERS_MS};

/// How the reason given to [`Handler::exhausted`] starts when the handler's output can never be
/// published (larger than the broker accepts), as opposed to retries running out.
pub const UNDELIVERABLE: &str = "undeliverable";

/// Why a broker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The AMQP client reported an error (connection, channel, protocol).
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused a publish.
    #[error("broker nacked a publish to `{routing_key}`")]
    Nacked {
        /// Where it was going.
        routing_key: String,
    },
    /// No queue was bound for a mandatory publish.
    #[error("no queue bound for exchange `{exchange}` routing key `{routing_key}`")]
    Unroutable {
        /// Exchange used.
        exchange: String,
        /// Routing key used.
        routing_key: String,
    },
    /// A confirm did not arrive in time (broker blocked or unreachable).
    #[error("publish confirm timed out")]
    ConfirmTimeout,
    /// Connecting, declaring the topology or starting to consume took too long.
    #[error("broker set-up timed out")]
    SetupTimeout,
    /// The message is larger than the broker accepts; sending it would only close the channel.
    #[error("a message to `{routing_key}` is {size} bytes; the broker accepts at most {limit} (amqp.max_message_bytes)")]
    TooLarge {
        /// Where it was going.
        routing_key: String,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The publisher was shut down.
    #[error("publisher closed")]
    Closed,
    /// Replies a client's queue refused could not be parked in PostgreSQL yet (a transient
    /// failure that outlasted the wait).
    #[error("refused replies not parked: {0}")]
    NotParked(String),
}

impl BrokerError {
    /// Whether the AMQP client could not read what the broker delivered. Short strings that are
    /// not UTF-8 and deeply nested headers, which RabbitMQ forwards unchecked, are read leniently
    /// (vendor/README.md), so this is a frame nothing can read (docs/tenancy.md §8). The broker
    /// gives it to the next connection as well, so a reconnect cannot mend it.
    pub fn unreadable_delivery(&self) -> bool {
        matches!(self, BrokerError::Amqp(e) if matches!(e.kind(), lapin::ErrorKind::ParsingError(_)))
    }

    /// What to do when the broker refused a declaration for a plugin it lacks (the ingress or
    /// stage partitions' consistent-hash exchange), spelled for an operator; `None` for any other
    /// error.
    pub fn missing_plugin(&self) -> Option<String> {
        let text = self.to_string();
        text.contains("unknown exchange type 'x-consistent-hash'").then(|| {
            "the RabbitMQ plugin rabbitmq_consistent_hash_exchange is not enabled, and \
             amqp.ingress_partitions > 1 or amqp.stage_partitions > 1 needs it: run `rabbitmq-plugins enable \
             rabbitmq_consistent_hash_exchange` on every node (deploy/rabbitmq/setup.sh does); \
             until then no request is consumed"
                .to_owned()
        })
    }
}

/// A received message, detached from the AMQP client.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Message body; shared, so the copy the runtime keeps for a retry or a dead letter costs
    /// nothing while a stage holds its own.
    pub body: bytes::Bytes,
    /// Headers, as text (booleans and numbers spelled out).
    pub headers: BTreeMap<String, String>,
    /// `message_id` property.
    pub message_id: Option<String>,
    /// `reply_to` property: where a client asked for the replies to its submission.
    pub reply_to: Option<String>,
    /// `user_id` property: the RabbitMQ user that published it, checked by the broker (a
    /// publish naming another user is refused), so it identifies a client's tenant.
    pub user_id: Option<String>,
    /// `type` property: what a client's message is (`turn.cancel`; a request needs none).
    pub kind: Option<String>,
    /// Whether the broker has delivered it before (a consumer may have crashed on it).
    pub redelivered: bool,
    /// 0 on first processing, +1 per retry through a delay queue.
    pub attempt: u32,
    /// The turn it names, read once when it arrives (see [`TurnHint`]).
    pub hint: TurnHint,
}

/// The session and turn a delivery names: from the `x-aptix-session-id` and `x-aptix-turn-id`
/// headers of inner messages, else from the handler's one scan of the body (client
/// submissions), so nothing downstream parses the body again to find them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnHint {
    /// The SessionId, if there is a valid one.
    pub session: Option<String>,
    /// The TurnId, if there is a valid one.
    pub turn: Option<String>,
}

impl TurnHint {
    /// The session and the turn, when both are known.
    pub fn pair(&self) -> Option<(&str, &str)> {
        self.session.as_deref().zip(self.turn.as_deref())
    }
}

/// What to do with a delivery once its handler ran.
#[derive(Debug)]
pub enum Disposition {
    /// Publish these (each confirmed), call [`Handler::published`], then ack.
    Forward {
        /// Messages for the next hop(s).
        messages: Vec<OutMessage>,
        /// Outbox rows the messages came from, deleted once confirmed.
        outbox_ids: Vec<i64>,
    },
    /// A transient failure: try again later, through a delay queue, until attempts run out.
    Retry {
        /// Why, for logs and the dead-letter entry.
        reason: String,
    },
    /// Can never be handled: copy to the dead-letter queue with the reason, publish `messages`
    /// (an error reply, when there is someone to tell), then ack.
    DeadLetter {
        /// Why.
        reason: String,
        /// Messages to publish alongside.
        messages: Vec<OutMessage>,
    },
}

impl Disposition {
    /// Forward messages that are not in the outbox.
    pub fn forward(messages: Vec<OutMessage>) -> Self {
        Disposition::Forward { messages, outbox_ids: Vec::new() }
    }
}

/// A stage as the runtime sees it.
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery.
    fn handle(&self, delivery: Delivery) -> BoxFuture<'_, Disposition>;

    /// Retries ran out: what to publish instead so the turn still ends with a reply
    /// (usually a failure outcome for the persist stage). The original is dead-lettered.
    fn exhausted(&self, delivery: Delivery, reason: String) -> BoxFuture<'_, Vec<OutMessage>>;

    /// Checked once before the stage consumes in this process; `Err` stops the start.
    fn prepare(&self) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }

    /// The turn a body names, for deliveries whose headers do not say (called once per
    /// delivery, when it arrives).
    fn hint(&self, body: &[u8]) -> TurnHint {
        let _ = body;
        TurnHint::default()
    }

    /// The tenant whose dead-letter queue keeps `delivery` when it is given up (`None`: the
    /// shared one). Asked only of messages that passed the pipeline's checks.
    fn tenant(&self, delivery: &Delivery) -> Option<crate::contracts::TenantName> {
        let _ = delivery;
        None
    }

    /// Deliveries with the same key are handled one at a time, in delivery order (deliveries
    /// without a key, or with different keys, run concurrently).
    fn ordering_key(&self, delivery: &Delivery) -> Option<String> {
        let _ = delivery;
        None
    }

    /// For stages with an [`Handler::ordering_key`]: counts, durably, one more delivery of a
    /// message whose consumer died and returns the total. Such a message is handled in place
    /// (re-publishing it would put it behind later messages of its key), so the runtime cannot
    /// count in a header. `Ok(None)` means not counted; `Err` means try again later.
    fn count_redelivery(
        &self,
        delivery: &Delivery,
    ) -> BoxFuture<'_, Result<Option<u32>, BoxError>> {
        let _ = delivery;
        Box::pin(async { Ok(None) })
    }

    /// Keeps replies their client's queue refused in durable storage, to be offered to their
    /// queue again later (`crate::redeliver`). A transient error is waited out, the delivery
    /// held where it stands; a permanent one keeps them in `<prefix>.unrouted` instead.
    fn park(&self, refused: Vec<Refused>) -> BoxFuture<'_, Result<(), ParkError>> {
        let _ = refused;
        Box::pin(async { Err(ParkError::Permanent("this handler parks nothing".into())) })
    }

    /// The messages of a [`Disposition::Forward`] were confirmed; clean up their outbox rows.
    fn published(&self, outbox_ids: Vec<i64>) -> BoxFuture<'_, ()> {
        let _ = outbox_ids;
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::BrokerError;

    /// A frame lapin's parser fails on reads as unreadable, and nothing else does.
    #[test]
    fn a_frame_the_client_cannot_parse_is_an_unreadable_delivery() {
        let parsed = lapin::types::parsing::parse_value(&b"?"[..]);
        let kind = lapin::ErrorKind::ParsingError(parsed.unwrap_err());
        assert!(BrokerError::Amqp(lapin::Error::from(kind)).unreadable_delivery());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!BrokerError::Amqp(lapin::Error::from(io)).unreadable_delivery());
        assert!(!BrokerError::Closed.unreadable_delivery());
    }

    /// What RabbitMQ forwards unchecked is read, not failed (vendor/README.md): a short string
    /// that is not UTF-8, and a header nested past what is kept.
    #[test]
    fn the_patched_parser_reads_what_rabbitmq_forwards() {
        use lapin::types::{parsing, AMQPValue};
        let (_, s) = parsing::parse_short_string(&b"\x04x\xff\xfey"[..]).unwrap();
        assert_eq!(s.as_str(), "x\u{fffd}\u{fffd}y");
        // 255 bytes not UTF-8 read as at most 255 bytes: what is read can be written back.
        let long = [&[255u8][..], &[0xff; 255]].concat();
        let (_, s) = parsing::parse_short_string(&long[..]).unwrap();
        assert!(s.as_str().len() <= 255 && s.as_str().ends_with('\u{fffd}'));
        let mut nested = vec![b'V'];
        for _ in 0..20_000 {
            let len = u32::try_from(nested.len()).unwrap().to_be_bytes();
            nested = [&b"A"[..], &len, &nested].concat();
        }
        let (rest, value) = parsing::parse_value(&nested[..]).unwrap();
        assert!(rest.is_empty() && matches!(value, AMQPValue::FieldArray(_)));
    }
}
