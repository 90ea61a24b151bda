//! Outgoing messages and the confirmed publisher. Every publish is persistent, `mandatory`, and
//! waits for the broker's confirm; an unroutable message is an error, never a silent drop.
//!
//! lapin attaches a `basic.return` to whichever confirm it resolves next, without checking
//! delivery tags, so concurrent mandatory publishes on one channel can be charged each other's
//! returns. Each publish therefore has a channel to itself until its confirm arrives: channels
//! come from a pool, and a return always belongs to the one publish outstanding on its channel.
//! A channel the broker closed (a refused message, a failed declaration) is dropped and the next
//! publish opens a fresh one, so one bad message never leaves the worker unable to publish.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, Connection};
use tokio::sync::Semaphore;

use super::runtime::Frames;
use super::{BrokerError, OutMessage};

/// Most channels one publisher keeps open, i.e. publishes awaiting their confirm at once.
const MAX_CHANNELS: usize = 256;

/// Confirm-mode channels on one connection, one publish per channel at a time. Cloning shares
/// the pool.
#[derive(Clone, Debug)]
pub struct Publisher {
    inner: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    conn: Connection,
    /// For declarations at start-up (no confirms, never used for publishing).
    control: Channel,
    idle: Mutex<Vec<Channel>>,
    slots: Semaphore,
    max_message_bytes: usize,
    confirm_timeout: Duration,
    sessions: super::replies::SessionQueues,
}

impl Publisher {
    /// A publisher owning `conn` that refuses messages over `max_message_bytes` before sending
    /// them (the broker would close the channel over them) and waits at most `confirm_timeout`
    /// for a confirm. It owns the connection because it opens channels as it needs them.
    pub async fn open_with(
        conn: Connection,
        max_message_bytes: usize,
        confirm_timeout: Duration,
    ) -> Result<Self, BrokerError> {
        let control = conn.create_channel().await?;
        let inner = Pool {
            conn,
            control,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(MAX_CHANNELS),
            max_message_bytes,
            confirm_timeout,
            sessions: Default::default(),
        };
        Ok(Publisher { inner: Arc::new(inner) })
    }

    /// Connects to `url` for publishing, with RabbitMQ 4's default message size limit (16 MiB)
    /// and a 30 s confirm wait.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        Self::connect_framed(url, Frames::Own).await
    }

    /// Like [`Publisher::connect`], on a connection that takes the broker's frames: the
    /// operators' tools read dead letters with it, which hold what clients wrote.
    pub async fn connect_reading_clients(url: &str) -> Result<Self, BrokerError> {
        Self::connect_framed(url, Frames::Clients).await
    }

    async fn connect_framed(url: &str, frames: Frames) -> Result<Self, BrokerError> {
        let conn = super::runtime::connect_named(url, "aptix", frames).await?;
        Self::open_with(conn, 16 * 1024 * 1024, Duration::from_secs(30)).await
    }

    /// Closes the connection (waiting for the broker at most `limit`).
    pub async fn close(&self, limit: Duration) {
        let close = self.inner.conn.close(200, "publisher closing".into());
        let _ = tokio::time::timeout(limit, close).await;
    }

    /// A channel for declarations at start-up.
    pub fn channel(&self) -> &Channel {
        &self.inner.control
    }

    /// A fresh channel of the publisher's connection, for operations that may fail and close it
    /// (a passive declare of a queue that may not exist). The caller closes it.
    pub async fn scratch_channel(&self) -> Result<Channel, BrokerError> {
        Ok(self.inner.conn.create_channel().await?)
    }

    /// The session reply queues this publisher made ready.
    pub(super) fn sessions(&self) -> &super::replies::SessionQueues {
        &self.inner.sessions
    }

    /// Offers a parked reply to its client's queue again (`crate::redeliver`).
    pub async fn deliver_parked(
        &self,
        topology: &super::Topology,
        m: &OutMessage,
    ) -> Result<super::Handed, BrokerError> {
        self.inner.sessions.deliver_parked(self, topology, m).await
    }

    /// Whether the underlying connection is still usable.
    pub fn is_connected(&self) -> bool {
        self.inner.conn.status().connected()
    }

    /// Publishes and waits for the confirm, on a channel no other publish uses meanwhile. A
    /// nack or a broken channel is retried on a fresh channel while the connection lives: after
    /// a cluster node is lost, a channel opened at the wrong moment can nack every publish for
    /// minutes while a new one is accepted at once. A resend may duplicate the message; every
    /// consumer dedupes (docs/reliability.md).
    pub async fn publish(&self, msg: &OutMessage) -> Result<(), BrokerError> {
        self.publish_tries(msg, RESENDS).await
    }

    /// Like [`Publisher::publish`], with at most `tries` attempts (at least one).
    pub async fn publish_tries(&self, msg: &OutMessage, tries: u32) -> Result<(), BrokerError> {
        let limit = self.inner.max_message_bytes;
        if msg.body.len() > limit {
            return Err(BrokerError::TooLarge {
                routing_key: msg.routing_key.clone(),
                size: msg.body.len(),
                limit,
            });
        }
        let mut pause = Duration::from_millis(50);
        for _ in 1..tries {
            match self.publish_once(msg).await {
                Err(e) if resendable(&e) && self.is_connected() => {
                    tracing::debug!(error = %e, routing_key = %msg.routing_key, "resending on a fresh channel");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
        self.publish_once(msg).await
    }

    async fn publish_once(&self, msg: &OutMessage) -> Result<(), BrokerError> {
        let Ok(_slot) = self.inner.slots.acquire().await else {
            return Err(BrokerError::Closed);
        };
        let channel = self.take_channel().await?;
        match self.confirmed(publish_on(&channel, msg)).await {
            // Unroutable is about the message; the channel is fine.
            Some(Ok(outcome @ (Ok(()) | Err(BrokerError::Unroutable { .. })))) => {
                self.give_back(channel);
                outcome
            }
            // The channel may be closed (the broker refused something), nack everything, or
            // still owe a confirm (and with it, perhaps, a return): never reuse it.
            failed => {
                discard(channel);
                Err(match failed {
                    Some(Ok(Err(e)) | Err(e)) => e,
                    _ => BrokerError::ConfirmTimeout,
                })
            }
        }
    }

    /// Waits for `publish` (a publish and its confirm) at most `confirm_timeout` (`None` then),
    /// and gives up within `CONNECTION_CHECK` once the connection is broken: lapin can queue a
    /// publish on a channel it has not yet marked broken, whose confirm then never comes.
    async fn confirmed<F>(&self, publish: F) -> Option<F::Output>
    where
        F: std::future::Future<Output = Result<Result<(), BrokerError>, BrokerError>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.confirm_timeout;
        let mut publish = std::pin::pin!(publish);
        loop {
            let check = (tokio::time::Instant::now() + CONNECTION_CHECK).min(deadline);
            match tokio::time::timeout_at(check, &mut publish).await {
                Ok(done) => return Some(done),
                Err(_) if tokio::time::Instant::now() >= deadline => return None,
                Err(_) if !self.is_connected() => return Some(Err(BrokerError::Closed)),
                Err(_) => {}
            }
        }
    }

    /// Publishes `msg` to a queue where messages end for an operator (`msg.routing_key` on the
    /// default exchange), declaring the queue first when it does not exist yet: a tenant's
    /// dead-letter and unrouted queues are made by their first message.
    pub async fn publish_to_sink(
        &self,
        topology: &super::Topology,
        msg: &OutMessage,
    ) -> Result<(), BrokerError> {
        match self.publish(msg).await {
            Err(BrokerError::Unroutable { .. }) => {
                let ch = self.scratch_channel().await?;
                let declared = topology.declare_sink(&ch, &msg.routing_key).await;
                let _ = ch.close(200, "declared".into()).await;
                declared?;
                self.publish(msg).await
            }
            other => other,
        }
    }

    /// Publishes several messages, waiting for all confirms (concurrently, not one by one).
    pub async fn publish_all(&self, msgs: &[OutMessage]) -> Result<(), BrokerError> {
        let results = futures_util::future::join_all(msgs.iter().map(|m| self.publish(m))).await;
        results.into_iter().collect()
    }

    async fn take_channel(&self) -> Result<Channel, BrokerError> {
        loop {
            let popped = self.inner.idle.lock().ok().and_then(|mut idle| idle.pop());
            match popped {
                Some(ch) if ch.status().connected() => return Ok(ch),
                Some(_) => continue,
                None => break,
            }
        }
        crate::metrics::metrics().amqp("channel.open");
        crate::metrics::metrics().amqp("confirm.select");
        let channel = self.inner.conn.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(channel)
    }

    fn give_back(&self, channel: Channel) {
        if let Ok(mut idle) = self.inner.idle.lock() {
            idle.push(channel);
        }
    }
}

/// Attempts of one publish (first included) while the connection lives.
const RESENDS: u32 = 6;

/// How often a publish still waiting for its confirm looks at its connection.
const CONNECTION_CHECK: Duration = Duration::from_millis(250);

/// Whether a failed publish may succeed on a fresh channel of the same connection.
fn resendable(e: &BrokerError) -> bool {
    // Not a confirm timeout: the broker is blocked (a resource alarm) or gone, and waiting
    // again only holds the delivery longer; the message returns to its queue instead.
    matches!(e, BrokerError::Nacked { .. } | BrokerError::Amqp(_))
}

/// Closes a channel that must not be reused, without holding up the caller on a broker that
/// does not answer.
fn discard(channel: Channel) {
    if channel.status().connected() {
        tokio::spawn(async move {
            let close = channel.close(200, "dropped after an error".into());
            let _ = tokio::time::timeout(Duration::from_secs(2), close).await;
        });
    }
}

/// One publish on a channel that has no other publish outstanding. The outer error means the
/// channel is unusable; the inner one is about this message only.
async fn publish_on(
    channel: &Channel,
    msg: &OutMessage,
) -> Result<Result<(), BrokerError>, BrokerError> {
    crate::metrics::metrics().amqp("basic.publish");
    let confirm = channel
        .basic_publish(
            msg.exchange.as_str().into(),
            msg.routing_key.as_str().into(),
            BasicPublishOptions { mandatory: true, ..Default::default() },
            &msg.body,
            msg.properties(),
        )
        .await?
        .await?;
    if confirm.is_nack() {
        return Ok(Err(BrokerError::Nacked { routing_key: msg.routing_key.clone() }));
    }
    // With `mandatory`, an unroutable message is still acked and its return attached here;
    // with one publish per channel the return can only be this message's.
    match confirm.take_message() {
        None => Ok(Ok(())),
        Some(returned) => {
            let id = returned.delivery.properties.message_id().as_ref().map(|m| m.to_string());
            if id.as_deref() != Some(msg.message_id.as_str()) {
                tracing::warn!(expected = %msg.message_id, returned = ?id, "return of another message on a channel");
            }
            Ok(Err(BrokerError::Unroutable {
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            }))
        }
    }
}
