//! The client side of the protocol (docs/client-protocol.md) for Aptix's own tools (`aptix
//! demo`, `aptix submit`): declare a session's reply queue, publish a request to the entry
//! exchange, read the replies. Keeps AMQP inside the broker module.

use std::collections::BTreeMap;

use futures_util::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Acker;
use lapin::{Channel, Connection, Consumer};

use super::delivery::headers_of;
use super::{connect, BrokerError, Publisher, Topology};
use crate::contracts::{headers, SessionId, TenantName};

/// A connection that publishes requests and reads session replies.
#[derive(Debug)]
pub struct SessionClient {
    conn: Connection,
    publisher: Publisher,
    topology: Topology,
    /// The tenant it publishes for (docs/tenancy.md), if any.
    tenant: Option<TenantName>,
    /// Its user, sent as `user_id` when it publishes for a tenant.
    user_id: Option<String>,
}

impl SessionClient {
    /// Connects to `url` and declares the entry exchange (idempotent), nothing behind it: the
    /// ingress layout is the validate workers' and `aptix repartition`'s to bind. A client
    /// whose `amqp.ingress_partitions` is not the deployment's (a tool run with the defaults
    /// against a partitioned ingress) bound the single `P.requests` to it again, and every
    /// request was also copied into a queue nobody reads. A request published before any
    /// worker declared the layout is refused as unroutable.
    pub async fn connect(url: &str, topology: Topology) -> Result<Self, BrokerError> {
        let conn = connect(url).await?;
        let publisher = Publisher::connect(url).await?;
        topology.declare_entry(publisher.channel()).await?;
        Ok(SessionClient { conn, publisher, topology, tenant: None, user_id: None })
    }

    /// Connects to `url` and declares the whole `topology` (idempotent): for `aptix demo`,
    /// which runs the pipeline it talks to with the same settings.
    pub async fn connect_declaring(url: &str, topology: Topology) -> Result<Self, BrokerError> {
        let client = Self::connect(url, topology).await?;
        client.topology.declare(client.publisher.channel()).await?;
        Ok(client)
    }

    /// Connects to `url` as a user of `tenant`, which may declare nothing but its own reply
    /// queues: the topology is the workers' to declare.
    pub async fn connect_as(
        url: &str,
        topology: Topology,
        tenant: TenantName,
    ) -> Result<Self, BrokerError> {
        let conn = connect(url).await?;
        let publisher = Publisher::connect(url).await?;
        let user_id = Some(url_user(url.split(',').next().unwrap_or(url)));
        Ok(SessionClient { conn, publisher, topology, tenant: Some(tenant), user_id })
    }

    /// Declares `session`'s reply queue, as a client does before its first request.
    pub async fn open_session(&self, session: &SessionId) -> Result<(), BrokerError> {
        let queue = self.topology.session_queue_of(self.tenant.as_ref(), session);
        Ok(super::topology::durable_queue(self.publisher.channel(), &queue, FieldTable::default())
            .await?)
    }

    /// Publishes a request (`routing_key` = its SessionId) and waits for the broker's confirm.
    pub async fn submit(
        &self,
        routing_key: &str,
        message_id: String,
        body: Vec<u8>,
    ) -> Result<(), BrokerError> {
        let mut request = self.topology.request(routing_key, message_id, body);
        request.user_id.clone_from(&self.user_id);
        self.publisher.publish(&request).await
    }

    /// Consumes `session`'s reply queue; at most `prefetch` replies are held unacked.
    pub async fn replies(
        &self,
        session: &SessionId,
        prefetch: u16,
    ) -> Result<Replies, BrokerError> {
        let channel = self.conn.create_channel().await?;
        channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let queue = self.topology.session_queue_of(self.tenant.as_ref(), session);
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Replies { channel, consumer })
    }

    /// The entry exchange requests go to.
    pub fn requests_exchange(&self) -> String {
        self.topology.requests_exchange()
    }
}

/// The user of an `amqp://user:password@host/` URL, percent-decoded (`guest` when it names
/// none, as RabbitMQ's clients default).
pub fn url_user(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let Some((userinfo, _)) = rest.split_once('@') else { return "guest".to_owned() };
    crate::config::percent_decode(userinfo.split(':').next().unwrap_or_default(), false)
}

/// Messages of a session's reply queue, in order.
#[derive(Debug)]
pub struct Replies {
    channel: Channel,
    consumer: Consumer,
}

/// One reply-queue message (a reply or a stream delta); unacked messages go back to the queue
/// when the consumer closes.
#[derive(Debug)]
pub struct ReplyMessage {
    /// The body.
    pub body: Vec<u8>,
    /// Headers as text.
    pub headers: BTreeMap<String, String>,
    /// The `message_id` property.
    pub message_id: Option<String>,
    /// The `correlation_id` property: the request a refusal or re-sent reply answers.
    pub correlation_id: Option<String>,
    acker: Acker,
}

impl ReplyMessage {
    /// A header as text.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.get(key).map(String::as_str)
    }

    /// Whether it is a reply (not a stream delta).
    pub fn is_reply(&self) -> bool {
        self.header(headers::KIND) == Some("reply")
    }

    /// Removes it from the queue.
    pub async fn ack(&self) -> Result<(), BrokerError> {
        self.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }
}

impl Replies {
    /// The next message; `None` when the consumer stopped.
    pub async fn next(&mut self) -> Option<Result<ReplyMessage, BrokerError>> {
        let d = match self.consumer.next().await? {
            Ok(d) => d,
            Err(e) => return Some(Err(e.into())),
        };
        let headers = d.properties.headers().as_ref().map(headers_of).unwrap_or_default();
        let message_id = d.properties.message_id().as_ref().map(|m| m.to_string());
        let correlation_id = d.properties.correlation_id().as_ref().map(|c| c.to_string());
        Some(Ok(ReplyMessage { body: d.data, headers, message_id, correlation_id, acker: d.acker }))
    }

    /// Stops consuming.
    pub async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
    }
}
