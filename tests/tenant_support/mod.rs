//! A tenant's client for the tenancy tests: a RabbitMQ user of its own (created by
//! `deploy/rabbitmq/add-tenant.sh`, with the permissions docs/tenancy.md gives a tenant),
//! publishing as docs/client-protocol.md says, with `user_id` set, reading its own queues.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use serde_json::Value;

use crate::common::{reply_of, ReplyMsg};

/// A tenant's publisher.
pub struct TenantClient {
    pub user: String,
    pub tenant: String,
    pub prefix: String,
    pub conn: Connection,
    pub ch: Channel,
}

/// Creates (or updates) RabbitMQ user `user` with tenant `tenant`'s permissions under `prefix`,
/// by running the shipped `deploy/rabbitmq/add-tenant.sh`, so the tests prove its permissions.
pub fn create_user(user: &str, password: &str, prefix: &str, tenant: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rabbitmq/add-tenant.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args([tenant, prefix])
        .env("APTIX_TENANT_USER", user)
        .env("APTIX_TENANT_PASSWORD", password)
        .env_remove("APTIX_TENANT_PASSWORD_FILE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "add-tenant.sh {tenant} {prefix}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deletes a user made by [`create_user`].
pub fn delete_user(user: &str) {
    let _ = std::process::Command::new("rabbitmqctl").args(["-q", "delete_user", user]).output();
}

impl TenantClient {
    pub async fn connect(user: &str, password: &str, tenant: &str, prefix: &str) -> Self {
        let url = format!("amqp://{user}:{password}@127.0.0.1:5672/%2f");
        let conn = aptix::broker::connect(&url).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        TenantClient { user: user.into(), tenant: tenant.into(), prefix: prefix.into(), conn, ch }
    }

    /// This tenant's reply queue of `session`.
    pub fn queue(&self, session: &str) -> String {
        format!("{}.session.{}.{session}", self.prefix, self.tenant)
    }

    /// Declares the session's reply queue (durable, no arguments).
    pub async fn declare(&self, session: &str) {
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        let q = self.queue(session);
        self.ch.queue_declare(q.as_str().into(), durable, FieldTable::default()).await.unwrap();
    }

    /// Publishes a request as `user_id` (the client's own user unless given), confirmed.
    pub async fn publish_as(&self, request: &Value, user_id: Option<&str>) {
        let session = request["SessionId"].as_str().unwrap_or("-").to_owned();
        let mut props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(uuid::Uuid::new_v4().to_string().into());
        if let Some(u) = user_id {
            props = props.with_user_id(u.into());
        }
        let exchange = format!("{}.requests", self.prefix);
        let body = serde_json::to_vec(request).unwrap();
        let confirm = self
            .ch
            .basic_publish(
                exchange.as_str().into(),
                session.as_str().into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                &body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "request not confirmed: {confirm:?}");
    }

    /// Publishes `body` under `session` (routing key) with `props`, confirmed.
    async fn publish_bytes(&self, session: &str, body: &[u8], props: BasicProperties) {
        let props = props
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(uuid::Uuid::new_v4().to_string().into())
            .with_user_id(self.user.as_str().into());
        let exchange = format!("{}.requests", self.prefix);
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        let publish =
            self.ch.basic_publish(exchange.as_str().into(), session.into(), options, body, props);
        let confirm = publish.await.unwrap().await.unwrap();
        assert!(confirm.is_ack(), "not confirmed: {confirm:?}");
    }

    /// A body that names no session (routing key `-`).
    pub async fn publish_raw(&self, body: &[u8]) {
        self.publish_bytes("-", body, BasicProperties::default()).await;
    }

    /// `turn.cancel` of `turn` (client protocol §7a).
    pub async fn cancel(&self, session: &str, turn: &str) {
        let body =
            serde_json::to_vec(&serde_json::json!({"SessionId": session, "TurnId": turn})).unwrap();
        let props = BasicProperties::default().with_type("turn.cancel".into());
        self.publish_bytes(session, &body, props).await;
    }

    /// A request carrying the headers the broker and the pipeline write on dead letters and
    /// stage messages, naming a stage queue.
    pub async fn publish_forged(&self, request: &Value) {
        let session = request["SessionId"].as_str().unwrap_or("-").to_owned();
        let retrieve = format!("{}.retrieve", self.prefix);
        let mut headers = FieldTable::default();
        for (k, v) in [
            ("x-first-death-queue", retrieve.as_str()),
            ("x-first-death-reason", "rejected"),
            ("x-aptix-original-queue", retrieve.as_str()),
            ("x-aptix-stage", "retrieve"),
            ("x-aptix-mac", "00"),
        ] {
            headers.insert(k.into(), lapin::types::AMQPValue::LongString(v.into()));
        }
        let body = serde_json::to_vec(request).unwrap();
        self.publish_bytes(&session, &body, BasicProperties::default().with_headers(headers)).await;
    }

    /// Declares the session's queue and publishes, as the docs say.
    pub async fn submit(&self, request: &Value) {
        let session = request["SessionId"].as_str().unwrap().to_owned();
        self.declare(&session).await;
        self.publish_as(request, Some(&self.user.clone())).await;
    }

    /// Reads `queue` until `count` replies (not deltas) arrived or `timeout` passed.
    pub async fn read(&self, queue: &str, count: usize, timeout: Duration) -> Vec<ReplyMsg> {
        let ch = self.conn.create_channel().await.unwrap();
        let mut consumer = ch
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut out: Vec<ReplyMsg> = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while out.iter().filter(|r| r.is_final).count() < count {
            let Ok(Some(Ok(d))) = tokio::time::timeout_at(deadline, consumer.next()).await else {
                break;
            };
            d.ack(BasicAckOptions::default()).await.unwrap();
            out.push(reply_of(&d));
        }
        let _ = ch.close(200, "done".into()).await;
        out
    }

    /// Whether consuming `queue` is refused by the broker (403 closes the channel).
    pub async fn consume_refused(&self, queue: &str) -> bool {
        let ch = self.conn.create_channel().await.unwrap();
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let declared = ch.queue_declare(queue.into(), passive, FieldTable::default()).await;
        let consumed = match declared {
            Err(_) => return true,
            Ok(_) => {
                ch.basic_consume(
                    queue.into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
            }
        };
        consumed.is_err()
    }

    pub async fn close(self) {
        let _ = self.conn.close(200, "done".into()).await;
    }
}

/// The error codes of a reply.
pub fn codes(r: &ReplyMsg) -> Vec<String> {
    r.body["Errors"]
        .as_array()
        .map(|e| e.iter().filter_map(|x| x["Code"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}
