//! How a stage consumes: the settings the consume loop, the lanes and settling share. Its own
//! file so that settling does not use the consume loop that uses it.

use std::time::Duration;

use super::Topology;

/// Longest wait for connecting and declaring, or for closing.
pub(super) const SETUP_TIMEOUT: Duration = Duration::from_secs(20);

/// How a stage consumes.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Broker URL.
    pub amqp_url: String,
    /// Names.
    pub topology: Topology,
    /// Unacked deliveries held at once, which is also the number handled concurrently.
    pub prefetch: u16,
    /// Attempts (first try included) before a transient failure becomes a failed turn.
    pub max_attempts: u32,
    /// Redeliveries after consumer crashes before a message counts as poison.
    pub max_redeliveries: u32,
    /// Longest wait for a publish confirm.
    pub confirm_timeout: Duration,
    /// Largest message the broker accepts (its `max_message_size`); bigger ones are never sent.
    pub max_message_bytes: usize,
    /// The keys that sign the messages published to stage queues and verify those consumed
    /// from them (`mac`). `None` only where a test drives a stage alone: nothing is signed or
    /// checked.
    pub keys: Option<super::MessageKeys>,
}
