//! Outgoing messages and the confirmed publisher. Every publish is persistent, `mandatory`, and
//! waits for the broker's confirm; an unroutable message is an error, never a silent drop.

use std::collections::BTreeMap;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};

use super::BrokerError;

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
    /// String headers (trace context, attempt, turn ids).
    pub headers: BTreeMap<String, String>,
    /// JSON body.
    pub body: Vec<u8>,
    /// For replies: the session whose queue to declare if the message turns out unroutable
    /// (the queue expired while the session was idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<crate::contracts::SessionId>,
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
        }
    }

    /// Adds a header.
    pub fn header(mut self, key: &str, value: impl Into<String>) -> Self {
        self.headers.insert(key.to_owned(), value.into());
        self
    }

    pub(crate) fn properties(&self) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in &self.headers {
            table.insert(ShortString::from(k.as_str()), AMQPValue::LongString(v.as_str().into()));
        }
        table.insert("x-aptix-kind".into(), AMQPValue::LongString(self.kind.as_str().into()));
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(self.message_id.as_str().into())
            .with_type(self.kind.as_str().into())
            .with_headers(table)
    }
}

/// A channel in confirm mode. Cloning shares the channel; lapin writes a publish's frames as one
/// unit, so concurrent publishes on it do not interleave.
#[derive(Clone, Debug)]
pub struct Publisher {
    channel: Channel,
}

impl Publisher {
    /// Opens a confirm-mode channel on `conn`.
    pub async fn open(conn: &Connection) -> Result<Self, BrokerError> {
        let channel = conn.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(Publisher { channel })
    }

    /// The underlying channel, for declarations.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes and waits for the confirm.
    pub async fn publish(&self, msg: &OutMessage) -> Result<(), BrokerError> {
        let confirm = self
            .channel
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
            return Err(BrokerError::Nacked { routing_key: msg.routing_key.clone() });
        }
        // With `mandatory`, an unroutable message is still acked; the return is attached here.
        if confirm.take_message().is_some() {
            return Err(BrokerError::Unroutable {
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            });
        }
        Ok(())
    }

    /// Publishes several messages, waiting for all confirms (pipelined, not one by one).
    pub async fn publish_all(&self, msgs: &[OutMessage]) -> Result<(), BrokerError> {
        let results = futures_util::future::join_all(msgs.iter().map(|m| self.publish(m))).await;
        results.into_iter().collect()
    }
}
