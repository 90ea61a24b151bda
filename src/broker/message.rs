//! An outgoing message as the broker module publishes it: body, id, kind, typed headers, and
//! whether it goes to a session's reply queue.

use std::collections::BTreeMap;

use crate::contracts::headers;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;

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
    /// For replies and deltas to a backend instance's queue instead of the session's: the
    /// instance, whose queue (declared by its client) must be bound first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<crate::contracts::InstanceName>,
    /// For replies and deltas: the tenant whose reply queue (session's or instance's) it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<crate::contracts::TenantName>,
    /// Whether the session's queue may be created for this message (an admitted session), or
    /// only bound if the client declared it (a refusal, which must leave nothing behind).
    #[serde(default = "yes")]
    pub create_queue: bool,
    /// For replies that answer one submission: the request's `message_id`, sent as the AMQP
    /// `correlation_id` property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// For requests a client publishes: its RabbitMQ user, as the `user_id` property (the broker
    /// checks it; docs/tenancy.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// For a replayed request: the `reply_to` its client sent it with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
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
            instance: None,
            tenant: None,
            create_queue: true,
            correlation_id: None,
            user_id: None,
            reply_to: None,
        }
    }

    /// The same reply or delta, routed to the reply queue at `to`: its tenant's, and the
    /// backend instance's when one is named (else its session's). The routing key names the
    /// tenant, so a tenant's queue never matches another tenant's replies.
    pub fn to(mut self, to: &crate::contracts::ReplyAddress) -> Self {
        let tenant = to.tenant.as_ref();
        self.tenant = to.tenant.clone();
        if let Some(instance) = &to.instance {
            self.routing_key = super::Topology::instance_key(tenant, instance);
            self.instance = Some(instance.clone());
        } else if let Some(session) = &self.session {
            self.routing_key = super::Topology::session_key(tenant, session);
        }
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: &str, value: impl Into<HeaderValue>) -> Self {
        self.headers.insert(key.to_owned(), value.into());
        self
    }

    /// The session and turn its `x-aptix-session-id` and `x-aptix-turn-id` headers name.
    pub fn turn(&self) -> Option<(&str, &str)> {
        let text = |k: &str| match self.headers.get(k) {
            Some(HeaderValue::Str(s)) => Some(s.as_str()),
            _ => None,
        };
        Some((text(headers::SESSION_ID)?, text(headers::TURN_ID)?))
    }

    pub(crate) fn properties(&self) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in &self.headers {
            table.insert(ShortString::from(k.as_str()), v.amqp());
        }
        table.insert(headers::KIND.into(), AMQPValue::LongString(self.kind.as_str().into()));
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(self.message_id.as_str().into())
            .with_type(self.kind.as_str().into())
            .with_headers(table);
        let props = match &self.correlation_id {
            Some(id) => props.with_correlation_id(id.as_str().into()),
            None => props,
        };
        let props = match &self.reply_to {
            Some(to) => props.with_reply_to(to.as_str().into()),
            None => props,
        };
        match &self.user_id {
            Some(user) => props.with_user_id(user.as_str().into()),
            None => props,
        }
    }
}
