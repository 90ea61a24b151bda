//! Routing replies and deltas to the queues clients own (a session's, or a backend instance's).
//!
//! Such a queue, its arguments and its node belong to the client, so nothing it does may cost a
//! stage anything (docs/reliability.md, "Client-owned queues"). A reply is offered to its queue
//! once, within a bounded time and without in-place resends: a nack (a full queue under
//! `reject-publish`), a return, a refused or failed declaration (406, 405, a 404 because the
//! queue's node is down), a confirm that does not come: each hands the reply back as
//! [`Handed::Refused`], and the caller parks it in PostgreSQL (`crate::redeliver` offers it again
//! until the queue takes it). A queue that refused is remembered for a few seconds: the replies
//! to it meanwhile are parked behind the first without being offered (so they stay in order),
//! and its deltas are dropped at once (the final reply carries the whole answer). A reply for a
//! queue that does not exist and may not be created here (a refusal for a session nobody
//! declared, an instance queue the client deleted) is kept in `<prefix>.unrouted`; a delta for
//! it is dropped, as are the next few seconds' deltas for it, unlooked at.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use super::{BrokerError, OutMessage, Publisher, Topology};
use crate::contracts::headers;

/// How long a declared-and-bound reply queue is trusted without declaring it again. Far below
/// any sensible queue expiry; a queue deleted meanwhile is caught by the mandatory flag.
const TRUST: Duration = Duration::from_secs(300);
/// Queues remembered at most; the cache is cleared when full (costing one declare each).
const CAPACITY: usize = 100_000;
/// How long a queue that refused a reply is not offered another one by this process.
const REFUSING_FOR: Duration = Duration::from_secs(5);
/// The longest a client's queue may take to take a reply (declare, publish, confirm).
const CLIENT_WAIT: Duration = Duration::from_secs(5);
/// The longest an offer waits for a place among the publisher's channels (`offer_slots`), kept
/// short: with the client's own time it bounds how long a stage's settling takes.
const PLACE_WAIT: Duration = Duration::from_secs(1);
/// Tries of one publish to a client's queue on fresh channels: a second one covers a channel
/// opened at a bad moment of a node loss, more would only hold the stage.
const CLIENT_TRIES: u32 = 2;

/// Why a delta for a queue that does not exist was not published.
const NO_QUEUE: &str = "its queue does not exist";

/// What became of a message offered to a client's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handed {
    /// Confirmed by the broker: in its queue, or kept in `<prefix>.unrouted` because the queue
    /// does not exist and was not to be created.
    Done,
    /// The client's queue or its node did not take it; nothing of the stage was spent on it.
    Refused(String),
}

/// A reply its client's queue refused, to be parked in PostgreSQL.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The reply.
    pub message: OutMessage,
    /// The queue that refused it (the reply's target).
    pub queue: String,
    /// Why, for operators.
    pub reason: String,
}

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

/// The client's queue `m` goes to, if it goes to one.
pub fn client_queue(topology: &Topology, m: &OutMessage) -> Option<String> {
    Target::of(topology, m).map(|t| t.queue)
}

/// Queues noted lately, and when: at most [`CAPACITY`] (when full, those older than the age
/// asked for go, and all of them if none is).
#[derive(Debug, Default)]
struct Recent(Mutex<HashMap<String, Instant>>);

impl Recent {
    fn within(&self, queue: &str, age: Duration) -> bool {
        let Ok(map) = self.0.lock() else { return false };
        map.get(queue).is_some_and(|at| at.elapsed() < age)
    }

    /// Notes `queue` now; entries older than `age` go first when the map is full.
    fn note(&self, queue: &str, age: Duration) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= CAPACITY {
                map.retain(|_, at| at.elapsed() < age);
                if map.len() >= CAPACITY {
                    map.clear();
                }
            }
            map.insert(queue.to_owned(), Instant::now());
        }
    }

    fn remove(&self, queue: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(queue);
        }
    }
}

/// Queues that refused a reply in this process, and when. Process-wide: the publisher that
/// parks a reply and the one that delivers it later (`crate::redeliver`) are not the same.
fn refusing() -> &'static Recent {
    static REFUSING: OnceLock<Recent> = OnceLock::new();
    REFUSING.get_or_init(Default::default)
}

/// Queues with parked replies, as PostgreSQL last said (`crate::redeliver` refreshes it twice a
/// second in every stage process): a new reply to one of them parks behind the waiting ones.
fn waiting() -> &'static Mutex<Waiting> {
    static WAITING: OnceLock<Mutex<Waiting>> = OnceLock::new();
    WAITING.get_or_init(Default::default)
}

/// The queues with replies waiting, and those this process parked for lately, with when: a
/// list read from PostgreSQL before such a park does not hold it yet, and must not drop it.
#[derive(Default)]
struct Waiting {
    queues: HashSet<String>,
    parked_here: HashMap<String, Instant>,
}

/// Replaces the set of queues that have replies waiting in PostgreSQL with `queues`, as read
/// from a query begun at `read_at`; queues this process parked for since then stay in it.
pub fn set_waiting_queues(queues: HashSet<String>, read_at: Instant) {
    if let Ok(mut w) = waiting().lock() {
        w.parked_here.retain(|_, at| *at >= read_at);
        let newer: Vec<String> = w.parked_here.keys().cloned().collect();
        w.queues = queues;
        w.queues.extend(newer);
    }
}

/// Adds `queue` to the set of queues with replies waiting (this process just parked one).
pub(super) fn mark_waiting(queue: &str) {
    if let Ok(mut w) = waiting().lock() {
        w.queues.insert(queue.to_owned());
        w.parked_here.insert(queue.to_owned(), Instant::now());
    }
}

fn refused_lately(queue: &str) -> bool {
    if waiting().lock().is_ok_and(|w| w.queues.contains(queue)) {
        return true;
    }
    refusing().within(queue, REFUSING_FOR)
}

fn mark_refusing(queue: &str, refusing_now: bool) {
    if refusing_now {
        refusing().note(queue, REFUSING_FOR);
    } else {
        refusing().remove(queue);
    }
}

/// Reply queues this process declared and bound recently.
#[derive(Debug, Default)]
pub struct SessionQueues {
    ensured: Recent,
    /// Channels the declarations use, kept between them.
    spare: super::spare::SpareChannels,
    /// Places for offers, taken before the client's time starts.
    slots: super::offer_slots::OfferSlots,
    /// Queues found missing lately, for deltas.
    missing: Recent,
}

impl SessionQueues {
    fn fresh(&self, queue: &str) -> bool {
        self.ensured.within(queue, TRUST)
    }

    fn remember(&self, queue: &str) {
        self.ensured.note(queue, TRUST);
    }

    /// Whether `queue` was found missing lately: a delta for it is dropped without a look.
    fn missing_lately(&self, queue: &str) -> bool {
        self.missing.within(queue, REFUSING_FOR)
    }

    fn mark_missing(&self, queue: &str) {
        self.missing.note(queue, REFUSING_FOR);
    }

    fn forget(&self, queue: &str) {
        self.ensured.remove(queue);
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
        let ch = self.spare.take(publisher).await?;
        let options = if t.create { durable } else { passive };
        crate::metrics::metrics().amqp("queue.declare");
        let ch =
            match ch.queue_declare(t.queue.as_str().into(), options, FieldTable::default()).await {
                Ok(_) => ch,
                // Not there, and it must not be created here. Any other failure (its node down,
                // a channel that closed meanwhile) is the queue refusing, not missing.
                Err(e) if !t.create && queue_missing(&e) => return Ok(false),
                Err(e) if !t.create => return Err(e.into()),
                // A queue the client declared with arguments (or an earlier version with
                // `x-expires`) refuses the plain declaration (406) and closes the channel; it
                // exists, so binding is enough.
                Err(_) => {
                    let ch = self.spare.take(publisher).await?;
                    crate::metrics::metrics().amqp("queue.declare");
                    ch.queue_declare(t.queue.as_str().into(), passive, FieldTable::default())
                        .await?;
                    ch
                }
            };
        topology.bind_reply_queue(&ch, &t.queue, &t.key).await?;
        self.spare.give_back(ch);
        self.remember(&t.queue);
        Ok(true)
    }

    /// Offers a reply or delta to its client's queue (any other message is simply published);
    /// one to a queue with replies waiting is refused at once, to park behind them. `Err` only
    /// for what the pipeline owns: its connection, `<prefix>.unrouted`, or a message larger than
    /// the broker accepts.
    pub async fn publish(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        m: &OutMessage,
    ) -> Result<Handed, BrokerError> {
        self.hand(publisher, topology, m, false).await
    }

    /// Offers a parked reply to its queue again (`crate::redeliver`), whatever refused lately.
    /// Its queue existed when it refused the reply, so a queue missing now (the client
    /// replacing it) keeps the reply parked rather than sending it to `<prefix>.unrouted`.
    pub async fn deliver_parked(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        m: &OutMessage,
    ) -> Result<Handed, BrokerError> {
        self.hand(publisher, topology, m, true).await
    }

    async fn hand(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        m: &OutMessage,
        parked: bool,
    ) -> Result<Handed, BrokerError> {
        let Some(target) = Target::of(topology, m) else {
            return publisher.publish(m).await.map(|()| Handed::Done);
        };
        if !parked && refused_lately(&target.queue) {
            return Ok(Handed::Refused("behind a reply waiting for this queue".into()));
        }
        if m.kind == "delta" && self.missing_lately(&target.queue) {
            return Ok(Handed::Refused(NO_QUEUE.into()));
        }
        self.offer(publisher, topology, &target, m, parked).await
    }

    async fn offer(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        target: &Target,
        m: &OutMessage,
        parked: bool,
    ) -> Result<Handed, BrokerError> {
        let Some(_slot) = self.slots.take(m.tenant.as_ref(), PLACE_WAIT).await else {
            // Other offers hold the places: the wait was the pipeline's, so the queue is not
            // marked as refusing. A delta is dropped; a reply is parked like a refused one
            // (its queue's next replies park behind it until the redelivery loop sends them).
            crate::metrics::metrics().message("reply", "no_place_to_offer");
            return Ok(Handed::Refused("no place to offer it: other offers held them".into()));
        };
        let tried =
            tokio::time::timeout(CLIENT_WAIT, self.try_offer(publisher, topology, target, m));
        // `Ok(())`: the queue does not exist and may not be created here.
        let missing = match tried.await {
            Ok(Ok(true)) => {
                mark_refusing(&target.queue, false);
                self.missing.remove(&target.queue);
                return Ok(Handed::Done);
            }
            Ok(Ok(false)) => Ok(()),
            Ok(Err(e @ BrokerError::TooLarge { .. })) => return Err(e),
            Ok(Err(BrokerError::Unroutable { .. })) if !target.create => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BrokerError::ConfirmTimeout),
        };
        let error = match missing {
            Ok(()) if parked => return Ok(Handed::Refused("its queue does not exist now".into())),
            // A delta is not worth keeping for an operator (the final reply carries the whole
            // answer), nor a look for each of the stream's next ones.
            Ok(()) if m.kind == "delta" => {
                self.mark_missing(&target.queue);
                return Ok(Handed::Refused(NO_QUEUE.into()));
            }
            Ok(()) => return keep_unrouted(publisher, topology, m, "no such queue").await,
            Err(e) => e,
        };
        // A lost connection is the pipeline's, not the client's: the caller retries as usual.
        if !publisher.is_connected() {
            return Err(error);
        }
        self.forget(&target.queue);
        mark_refusing(&target.queue, true);
        crate::metrics::metrics().message("reply", "refused_by_client_queue");
        tracing::info!(queue = %target.queue, message_id = %m.message_id, %error, "client queue refused a reply");
        Ok(Handed::Refused(error.to_string()))
    }

    /// `Ok(true)`: confirmed in its queue; `Ok(false)`: the queue does not exist and may not be
    /// created here.
    async fn try_offer(
        &self,
        publisher: &Publisher,
        topology: &Topology,
        target: &Target,
        m: &OutMessage,
    ) -> Result<bool, BrokerError> {
        // The queue may have been deleted since it was trusted: declared again, once.
        let mut last = None;
        for _ in 0..2 {
            if !self.ensure(publisher, topology, target).await? {
                return Ok(false);
            }
            match publisher.publish_tries(m, CLIENT_TRIES).await {
                Err(e @ BrokerError::Unroutable { .. }) => {
                    self.forget(&target.queue);
                    last = Some(e);
                }
                other => return other.map(|()| true),
            }
        }
        Err(last.unwrap_or(BrokerError::Closed))
    }
}

/// Whether a passive declaration failed because the queue does not exist (a 404 that is not
/// its home node being down).
fn queue_missing(e: &lapin::Error) -> bool {
    super::layout::is_not_found(e) && !e.to_string().contains("down or inaccessible")
}

/// Keeps `m` in its tenant's unrouted queue (`<prefix>.unrouted.<tenant>`, made by its first
/// reply; `<prefix>.unrouted` without tenants) with where it was going and why (`reason`).
pub async fn keep_unrouted(
    publisher: &Publisher,
    topology: &Topology,
    m: &OutMessage,
    reason: &str,
) -> Result<Handed, BrokerError> {
    tracing::warn!(routing_key = %m.routing_key, message_id = %m.message_id, reason, "reply unroutable, kept in the unrouted queue");
    let mut kept = m.clone();
    kept.exchange = String::new();
    kept.routing_key = topology.unrouted_of(m.tenant.as_ref());
    (kept.session, kept.instance) = (None, None);
    kept.headers.insert(headers::UNROUTED_EXCHANGE.into(), m.exchange.clone().into());
    kept.headers.insert(headers::UNROUTED_ROUTING_KEY.into(), m.routing_key.clone().into());
    kept.headers.insert(headers::UNROUTED_REASON.into(), reason.into());
    publisher.publish_to_sink(topology, &kept).await.map(|()| Handed::Done)
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

    /// Publishes and waits for the confirm. Callers that need an order among their messages
    /// (a turn's deltas) await each before the next; the connection is shared, not held, so a
    /// slow queue of one turn never delays another turn's deltas. A delta its client's queue
    /// refused is dropped; a reply it refused is kept in `<prefix>.unrouted`.
    pub async fn publish(&self, message: OutMessage) -> Result<(), BrokerError> {
        let publisher = self.publisher().await?;
        let refused = super::publish_all(&publisher, &self.settings, &[message]).await?;
        for r in refused {
            keep_unrouted(&publisher, &self.settings.topology, &r.message, &r.reason).await?;
        }
        Ok(())
    }

    /// The publisher, connected (again, after a loss) on first use; the lock is held only
    /// while connecting, never while publishing.
    pub async fn publisher(&self) -> Result<Publisher, BrokerError> {
        let mut guard = self.publisher.lock().await;
        if let Some(p) = guard.as_ref().filter(|p| p.is_connected()) {
            return Ok(p.clone());
        }
        let conn = super::connect(&self.settings.amqp_url).await?;
        let s = &self.settings;
        let p = Publisher::open_with(conn, s.max_message_bytes, s.confirm_timeout).await?;
        if let Some(old) = guard.replace(p.clone()) {
            tokio::spawn(async move { old.close(Duration::from_secs(2)).await });
        }
        Ok(p)
    }

    /// Closes the connection, if one was opened (waiting for the broker at most `limit`).
    pub async fn close(&self, limit: Duration) {
        if let Some(p) = self.publisher.lock().await.take() {
            p.close(limit).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_read_before_a_park_keeps_that_queue_waiting() {
        let read_at = Instant::now();
        mark_waiting("q-parked-after-the-read");
        set_waiting_queues(HashSet::from(["q-listed".to_owned()]), read_at);
        assert!(refused_lately("q-parked-after-the-read"), "dropped by an older list");
        assert!(refused_lately("q-listed"));
        // A list read after it that no longer holds it (delivered meanwhile) drops it.
        set_waiting_queues(HashSet::new(), Instant::now());
        assert!(!refused_lately("q-parked-after-the-read"));
    }
}
