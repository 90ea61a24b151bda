//! Routing replies: a session's reply queue exists and is bound before a reply to it is
//! published, and a reply that still finds no queue (the client deleted it) is kept in
//! `<prefix>.unrouted` for an operator — never dropped, never charged to another message.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use super::{BrokerError, OutMessage, Publisher, Topology};
use crate::contracts::SessionId;

/// How long a declared-and-bound session queue is trusted without declaring it again. Far below
/// any sensible queue expiry; a queue deleted meanwhile is caught by the mandatory flag.
const TRUST: Duration = Duration::from_secs(300);
/// Sessions remembered at most; the cache is cleared when full (costing one declare each).
const CAPACITY: usize = 100_000;

/// Session queues this process declared and bound recently.
#[derive(Debug, Default)]
pub struct SessionQueues {
    ensured: Mutex<HashMap<SessionId, Instant>>,
}

impl SessionQueues {
    fn fresh(&self, session: &SessionId) -> bool {
        let Ok(map) = self.ensured.lock() else { return false };
        map.get(session).is_some_and(|at| at.elapsed() < TRUST)
    }

    fn remember(&self, session: SessionId) {
        if let Ok(mut map) = self.ensured.lock() {
            if map.len() >= CAPACITY {
                map.clear();
            }
            map.insert(session, Instant::now());
        }
    }

    fn forget(&self, session: &SessionId) {
        if let Ok(mut map) = self.ensured.lock() {
            map.remove(session);
        }
    }

    /// Makes sure `session`'s queue exists (when `create`) and is bound. `Ok(false)`: the queue
    /// does not exist and was not to be created.
    pub async fn ensure(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        session: &SessionId,
        create: bool,
    ) -> Result<bool, BrokerError> {
        if self.fresh(session) {
            return Ok(true);
        }
        let queue = topology.session_queue(session);
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let ch = publisher.scratch_channel().await?;
        let declared = if create {
            ch.queue_declare(queue.as_str().into(), durable, FieldTable::default()).await
        } else {
            ch.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await
        };
        let ch = match declared {
            Ok(_) => ch,
            // Not there, and a refusal must not create it.
            Err(_) if !create => return Ok(false),
            // A queue declared by an earlier version with `x-expires` refuses the plain
            // declaration (406) and closes the channel; it exists, so binding is enough.
            Err(_) => {
                let ch = publisher.scratch_channel().await?;
                ch.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await?;
                ch
            }
        };
        topology.bind_session(&ch, session).await?;
        let _ = ch.close(200, "session queue ready".into()).await;
        self.remember(*session);
        Ok(true)
    }

    /// Publishes a reply or delta to its session: the queue made ready first, declared again if
    /// the message comes back unroutable, and kept in `<prefix>.unrouted` if it still does.
    pub async fn publish(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        session: &SessionId,
        m: &OutMessage,
    ) -> Result<(), BrokerError> {
        if self.ensure(publisher, topology, session, m.create_queue).await? {
            match publisher.publish(m).await {
                Err(BrokerError::Unroutable { .. }) => self.forget(session),
                other => return other,
            }
            if self.ensure(publisher, topology, session, m.create_queue).await? {
                match publisher.publish(m).await {
                    Err(BrokerError::Unroutable { .. }) => self.forget(session),
                    other => return other,
                }
            }
        }
        tracing::warn!(%session, message_id = %m.message_id, "reply unroutable, kept in the unrouted queue");
        let mut kept = m.clone();
        kept.exchange = String::new();
        kept.routing_key = topology.unrouted();
        kept.session = None;
        kept.headers.insert("x-aptix-unrouted-exchange".into(), m.exchange.clone().into());
        kept.headers.insert("x-aptix-unrouted-routing-key".into(), m.routing_key.clone().into());
        publisher.publish(&kept).await
    }
}

/// Publishes messages that no delivery's settling carries (stream deltas during an LLM call) on
/// a connection of its own, opened on first use and again after a failure.
#[derive(Debug)]
pub struct LazyPublisher {
    settings: super::RuntimeSettings,
    publisher: tokio::sync::Mutex<Option<Publisher>>,
}

impl LazyPublisher {
    /// Nothing is connected until the first publish.
    pub fn new(settings: super::RuntimeSettings) -> Self {
        LazyPublisher { settings, publisher: tokio::sync::Mutex::new(None) }
    }

    /// Publishes (in call order: callers are serialised) and waits for the confirm.
    pub async fn publish(&self, message: OutMessage) -> Result<(), BrokerError> {
        let mut guard = self.publisher.lock().await;
        if guard.is_none() {
            let conn = super::connect(&self.settings.amqp_url).await?;
            let s = &self.settings;
            *guard =
                Some(Publisher::open_with(conn, s.max_message_bytes, s.confirm_timeout).await?);
        }
        let Some(publisher) = guard.as_ref() else { return Err(BrokerError::Closed) };
        let result = super::publish_all(publisher, &self.settings, &[message]).await;
        if result.is_err() {
            if let Some(p) = guard.take() {
                p.close(Duration::from_secs(2)).await;
            }
        }
        result
    }
}
