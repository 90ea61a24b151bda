//! Outgoing messages and the confirmed publisher. Every publish is persistent, `mandatory`, and
//! waits for the broker's confirm; an unroutable message is an error, never a silent drop.
//!
//! lapin attaches a `basic.return` to whichever confirm it resolves next, without checking
//! delivery tags, so concurrent mandatory publishes on one channel can be charged each other's
//! returns. Each publish therefore has a channel to itself until its confirm arrives: channels
//! come from a pool, and a return always belongs to the one publish outstanding on its channel.
//! A channel the broker closed (a refused message, a failed declaration) is dropped and the next
//! publish opens a fresh one, so one bad message never leaves the worker unable to publish.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Semaphore;

use super::BrokerError;

/// A header value with its AMQP type: clients read booleans and integers as such.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    /// AMQP boolean.
    Bool(bool),
    /// AMQP long-long integer.
    Int(i64),
    /// AMQP long string.
    Str(String),
}

impl HeaderValue {
    /// The value as text (numbers and booleans spelled out).
    pub fn as_text(&self) -> String {
        match self {
            HeaderValue::Bool(b) => b.to_string(),
            HeaderValue::Int(i) => i.to_string(),
            HeaderValue::Str(s) => s.clone(),
        }
    }

    fn amqp(&self) -> AMQPValue {
        match self {
            HeaderValue::Bool(b) => AMQPValue::Boolean(*b),
            HeaderValue::Int(i) => AMQPValue::LongLongInt(*i),
            HeaderValue::Str(s) => AMQPValue::LongString(s.as_str().into()),
        }
    }
}

impl From<String> for HeaderValue {
    fn from(s: String) -> Self {
        HeaderValue::Str(s)
    }
}

impl From<&str> for HeaderValue {
    fn from(s: &str) -> Self {
        HeaderValue::Str(s.to_owned())
    }
}

impl From<bool> for HeaderValue {
    fn from(b: bool) -> Self {
        HeaderValue::Bool(b)
    }
}

impl From<i64> for HeaderValue {
    fn from(i: i64) -> Self {
        HeaderValue::Int(i)
    }
}

impl From<u32> for HeaderValue {
    fn from(i: u32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}

impl From<i32> for HeaderValue {
    fn from(i: i32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}

impl From<u64> for HeaderValue {
    fn from(i: u64) -> Self {
        HeaderValue::Int(i64::try_from(i).unwrap_or(i64::MAX))
    }
}

/// One message to publish.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutMessage {
    /// Exchange (`""` for the default exchange).
    pub exchange: String,
    /// Routing key (a queue name on the default exchange).
    pub routing_key: String,
    /// Stable id: the same logical message always has the same id, so consumers can dedupe.
    pub message_id: String,
    /// What the message is (`turn`, `reply`, `delta`, `dead`), also sent as a header.
    pub kind: String,
    /// Headers (trace context, attempt, turn ids), with their AMQP types.
    pub headers: BTreeMap<String, HeaderValue>,
    /// JSON body.
    pub body: Vec<u8>,
    /// For replies and deltas: the session whose reply queue must exist and be bound first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<crate::contracts::SessionId>,
    /// Whether the session's queue may be created for this message (an admitted session), or
    /// only bound if the client declared it (a refusal, which must leave nothing behind).
    #[serde(default = "yes")]
    pub create_queue: bool,
    /// For replies that answer one submission: the request's `message_id`, sent as the AMQP
    /// `correlation_id` property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
}

fn yes() -> bool {
    true
}

impl OutMessage {
    /// A message for the default exchange, i.e. straight to `queue`.
    pub fn to_queue(queue: String, kind: &str, message_id: String, body: Vec<u8>) -> Self {
        OutMessage {
            exchange: String::new(),
            routing_key: queue,
            message_id,
            kind: kind.to_owned(),
            headers: BTreeMap::new(),
            body,
            session: None,
            create_queue: true,
            correlation_id: None,
        }
    }

    /// Adds a header.
    pub fn header(mut self, key: &str, value: impl Into<HeaderValue>) -> Self {
        self.headers.insert(key.to_owned(), value.into());
        self
    }

    pub(crate) fn properties(&self) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in &self.headers {
            table.insert(ShortString::from(k.as_str()), v.amqp());
        }
        table.insert("x-aptix-kind".into(), AMQPValue::LongString(self.kind.as_str().into()));
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(self.message_id.as_str().into())
            .with_type(self.kind.as_str().into())
            .with_headers(table);
        match &self.correlation_id {
            Some(id) => props.with_correlation_id(id.as_str().into()),
            None => props,
        }
    }
}

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
        let conn = super::connect(url).await?;
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

    /// Whether the underlying connection is still usable.
    pub fn is_connected(&self) -> bool {
        self.inner.conn.status().connected()
    }

    /// Publishes and waits for the confirm, on a channel no other publish uses meanwhile.
    pub async fn publish(&self, msg: &OutMessage) -> Result<(), BrokerError> {
        let limit = self.inner.max_message_bytes;
        if msg.body.len() > limit {
            return Err(BrokerError::TooLarge {
                routing_key: msg.routing_key.clone(),
                size: msg.body.len(),
                limit,
            });
        }
        let Ok(_slot) = self.inner.slots.acquire().await else {
            return Err(BrokerError::Closed);
        };
        let channel = self.take_channel().await?;
        let confirmed = tokio::time::timeout(self.inner.confirm_timeout, publish_on(&channel, msg)).await;
        match confirmed {
            Ok(Ok(outcome)) => {
                self.give_back(channel);
                outcome
            }
            // The channel may be closed (the broker refused something) or still owe a confirm
            // (and with it, perhaps, a return): never reuse it.
            failed => {
                discard(channel);
                Err(match failed {
                    Ok(Err(e)) => e,
                    _ => BrokerError::ConfirmTimeout,
                })
            }
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
async fn publish_on(channel: &Channel, msg: &OutMessage) -> Result<Result<(), BrokerError>, BrokerError> {
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
