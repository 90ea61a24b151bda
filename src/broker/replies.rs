//! Routing replies: a reply queue (a session's, or a backend instance's) exists and is bound
//! before a reply to it is published, and a reply that still finds no queue (the client deleted
//! it) is kept in `<prefix>.unrouted` for an operator — never dropped, never charged to another
//! message.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use super::{BrokerError, OutMessage, Publisher, Topology};

/// How long a declared-and-bound reply queue is trusted without declaring it again. Far below
/// any sensible queue expiry; a queue deleted meanwhile is caught by the mandatory flag.
const TRUST: Duration = Duration::from_secs(300);
/// Queues remembered at most; the cache is cleared when full (costing one declare each).
const CAPACITY: usize = 100_000;

/// Where a reply goes: the queue, its routing key on the replies exchange, and whether the
/// server may create the queue (an admitted session's) or only bind one its client declared.
struct Target {
    queue: String,
    key: String,
    create: bool,
}

impl Target {
    fn of(topology: &Topology, m: &OutMessage) -> Option<Target> {
        let tenant = m.tenant.as_ref();
        if let Some(instance) = &m.instance {
            let queue = topology.instance_queue(tenant, instance);
            let key = Topology::instance_key(tenant, instance);
            // An instance queue is its client's: declared by it, never created here.
            return Some(Target { queue, key, create: false });
        }
        let session = m.session.as_ref()?;
        let (queue, key) =
            (topology.session_queue_of(tenant, session), Topology::session_key(tenant, session));
        Some(Target { queue, key, create: m.create_queue })
    }
}

/// Reply queues this process declared and bound recently.
#[derive(Debug, Default)]
pub struct SessionQueues {
    ensured: Mutex<HashMap<String, Instant>>,
}

impl SessionQueues {
    fn fresh(&self, queue: &str) -> bool {
        let Ok(map) = self.ensured.lock() else { return false };
        map.get(queue).is_some_and(|at| at.elapsed() < TRUST)
    }

    fn remember(&self, queue: &str) {
        if let Ok(mut map) = self.ensured.lock() {
            if map.len() >= CAPACITY {
                map.clear();
            }
            map.insert(queue.to_owned(), Instant::now());
        }
    }

    fn forget(&self, queue: &str) {
        if let Ok(mut map) = self.ensured.lock() {
            map.remove(queue);
        }
    }

    /// Makes sure the target queue exists (created when allowed) and is bound. `Ok(false)`: the
    /// queue does not exist and was not to be created.
    async fn ensure(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        t: &Target,
    ) -> Result<bool, BrokerError> {
        if self.fresh(&t.queue) {
            return Ok(true);
        }
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let ch = publisher.scratch_channel().await?;
        let options = if t.create { durable } else { passive };
        crate::metrics::metrics().amqp("channel.open");
        crate::metrics::metrics().amqp("queue.declare");
        let ch =
            match ch.queue_declare(t.queue.as_str().into(), options, FieldTable::default()).await {
                Ok(_) => ch,
                // Not there, and it must not be created here.
                Err(_) if !t.create => return Ok(false),
                // A queue declared by an earlier version with `x-expires` refuses the plain
                // declaration (406) and closes the channel; it exists, so binding is enough.
                Err(_) => {
                    let ch = publisher.scratch_channel().await?;
                    ch.queue_declare(t.queue.as_str().into(), passive, FieldTable::default())
                        .await?;
                    ch
                }
            };
        topology.bind_reply_queue(&ch, &t.queue, &t.key).await?;
        crate::metrics::metrics().amqp("channel.close");
        let _ = ch.close(200, "reply queue ready".into()).await;
        self.remember(&t.queue);
        Ok(true)
    }

    /// Publishes a reply or delta to its queue: made ready first, declared again if the message
    /// comes back unroutable, and kept in `<prefix>.unrouted` if it still does.
    pub async fn publish(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        m: &OutMessage,
    ) -> Result<(), BrokerError> {
        let Some(target) = Target::of(topology, m) else { return publisher.publish(m).await };
        for _ in 0..2 {
            if !self.ensure(publisher, topology, &target).await? {
                break;
            }
            match publisher.publish(m).await {
                Err(BrokerError::Unroutable { .. }) => self.forget(&target.queue),
                other => return other,
            }
        }
        tracing::warn!(queue = %target.queue, message_id = %m.message_id, "reply unroutable, kept in the unrouted queue");
        let mut kept = m.clone();
        kept.exchange = String::new();
        kept.routing_key = topology.unrouted();
        (kept.session, kept.instance) = (None, None);
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
