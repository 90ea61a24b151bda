//! The names of the AMQP headers Aptix writes and reads, in one place. Those a client reads are
//! part of the wire (docs/client-protocol.md); the rest are the pipeline's own marks on stage
//! messages and dead letters, which the ingress strips from what clients send.

/// The prefix of every Aptix header; a client's headers with it are dropped at the ingress.
pub const PREFIX: &str = "x-aptix-";

/// The session a message belongs to (replies, deltas, stage messages).
pub const SESSION_ID: &str = "x-aptix-session-id";
/// The turn a message belongs to.
pub const TURN_ID: &str = "x-aptix-turn-id";
/// What a message is (`reply`, `delta`, ...), beside the AMQP `type` property.
pub const KIND: &str = "x-aptix-kind";
/// The round trip of the turn a reply or delta belongs to.
pub const STEP: &str = "x-aptix-step";
/// A delta's sequence number within its round trip.
pub const SEQ: &str = "x-aptix-seq";
/// The event's place in its turn, across steps (deltas and step replies; §9a).
pub const EVENT_SEQ: &str = "x-aptix-event-seq";
/// Whether a reply ends its turn.
pub const FINAL: &str = "x-aptix-final";
/// A reply's outcome (`final`, `refused`, ...).
pub const OUTCOME: &str = "x-aptix-outcome";
/// The session's name, on its replies.
pub const SESSION_NAME: &str = "x-aptix-session-name";
/// When the session expires, on its replies (RFC 3339).
pub const SESSION_EXPIRES: &str = "x-aptix-session-expires";
/// The client protocol's version, on every reply and delta ([`PROTOCOL_VERSION`]).
pub const PROTOCOL: &str = "x-aptix-protocol";

/// The version of docs/client-protocol.md the server speaks: 2 since a turn may change the
/// session's mode (§7c); 1 before. Raised only when a client could see a difference.
pub const PROTOCOL_VERSION: i64 = 3;

/// The stage MAC of a message between stages (HMAC-SHA256; `config::keys`).
pub const MAC: &str = "x-aptix-mac";
/// The turn's path through the stages so far (`messages::hops`).
pub const HOPS: &str = "x-aptix-hops";
/// A retried copy's attempt number.
pub const ATTEMPT: &str = "x-aptix-attempt";
/// How often a copy's consumers died on it.
pub const REDELIVERIES: &str = "x-aptix-redeliveries";
/// Why the last attempt failed, on a retried copy.
pub const LAST_ERROR: &str = "x-aptix-last-error";

/// Why a dead letter was given up.
pub const REASON: &str = "x-aptix-reason";
/// The stage that gave a dead letter up.
pub const STAGE: &str = "x-aptix-stage";
/// The queue a dead letter was consumed from.
pub const ORIGINAL_QUEUE: &str = "x-aptix-original-queue";
/// The AMQP `type` a dead letter had there.
pub const ORIGINAL_TYPE: &str = "x-aptix-original-type";
/// The RabbitMQ user that published a dead letter's original (its tenant's).
pub const USER_ID: &str = "x-aptix-user-id";
/// A dead letter's original size, when only its head is kept.
pub const BODY_BYTES: &str = "x-aptix-body-bytes";
/// On a client's message's dead letter: its `reply_to`, which a replay sends it with again (the
/// worker's publish of the letter has a `reply_to` of its own to leave empty).
pub const REPLY_TO: &str = "x-aptix-reply-to";
/// On a replayed copy of a dead letter.
pub const REPLAYED: &str = "x-aptix-replayed";

/// Where an unrouted reply was going: the exchange.
pub const UNROUTED_EXCHANGE: &str = "x-aptix-unrouted-exchange";
/// Where an unrouted reply was going: the routing key.
pub const UNROUTED_ROUTING_KEY: &str = "x-aptix-unrouted-routing-key";
/// Why a reply is unrouted.
pub const UNROUTED_REASON: &str = "x-aptix-unrouted-reason";
