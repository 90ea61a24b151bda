//! Channels kept for declaring and binding client reply queues between uses. Each use takes one
//! for itself, so a declaration the broker refuses (which closes its channel) fails no other;
//! a channel that comes back open is kept for the next, one that was closed is dropped. Before,
//! every reply queue a process made ready cost a channel open and close of its own.

use std::sync::Mutex;

use lapin::Channel;

use super::{BrokerError, Publisher};

/// Channels kept at most: as many as declarations a process makes at the same time, usually.
const KEPT: usize = 4;

/// Open channels waiting for the next declaration.
#[derive(Debug, Default)]
pub(super) struct SpareChannels {
    idle: Mutex<Vec<Channel>>,
}

impl SpareChannels {
    /// A channel of `publisher`'s connection for one declaration: a kept one still open, else
    /// a new one.
    pub(super) async fn take(&self, publisher: &Publisher) -> Result<Channel, BrokerError> {
        while let Some(ch) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) {
            if ch.status().connected() {
                return Ok(ch);
            }
        }
        crate::metrics::metrics().amqp("channel.open");
        publisher.scratch_channel().await
    }

    /// Hands back a channel whose declaration went through: kept if open and there is room,
    /// dropped otherwise (lapin closes a dropped channel in the background, so the declaration
    /// never waits on the broker's answer to the close).
    pub(super) fn give_back(&self, ch: Channel) {
        if !ch.status().connected() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < KEPT {
                idle.push(ch);
                return;
            }
        }
        crate::metrics::metrics().amqp("channel.close");
    }
}
