//! Dead letters for an operator (`aptix dead`, the console): read them without taking them, and
//! replay or discard one by id while the pipeline runs.
//!
//! Reading takes messages with `basic.get` on a channel of its own and never acks them; closing
//! the channel returns them all, in order, to the head of the queue. A replay publishes the
//! copy with a confirm before it acks the dead letter, so a crash in between leaves the dead
//! letter in place (a second replay then sends a copy the stages drop by message id). Two
//! operators at once cannot take the same message: one holds it unacked while the other looks.

use std::collections::BTreeMap;

use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use serde::Serialize;

use super::delivery::headers_of;
use super::{BrokerError, OutMessage, Publisher, Topology};
use crate::contracts::headers;

/// Most messages one look reads (each is held until the look ends).
pub const MAX_LOOK: usize = 10_000;

/// Most bytes of each body a list of dead letters keeps: a list shows a look at each, and a
/// client can make letters of up to the broker's 16 MiB (200 of those would be 3 GiB).
pub const LISTED_BODY: usize = 64 * 1024;

/// One dead letter as the broker holds it.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Its `message_id` (the original message's).
    pub id: String,
    /// Why it was given up (`x-aptix-reason`, or the broker's `x-first-death-reason`).
    pub reason: String,
    /// The stage that gave it up (none when the broker dead-lettered it).
    pub stage: Option<String>,
    /// Where it was consumed from.
    pub original_queue: Option<String>,
    /// Its AMQP `type` there (`turn.cancel`, ...).
    pub original_type: Option<String>,
    /// The RabbitMQ user that published the original request, for ingress messages.
    pub user: Option<String>,
    /// The session and turn it belongs to, when known.
    pub session_id: Option<String>,
    /// The turn it belongs to, when known.
    pub turn_id: Option<String>,
    /// For a client's message: the `reply_to` it came with, which a replay sends it with again.
    pub reply_to: Option<String>,
    /// The dead-letter queue it is in (the shared one, or its tenant's).
    pub queue: String,
    /// Every text header.
    pub headers: BTreeMap<String, String>,
    /// The body, as published; in a list, its first [`LISTED_BODY`] bytes.
    #[serde(skip)]
    pub body: Vec<u8>,
    /// The body's whole size, bytes.
    pub body_bytes: usize,
}

impl DeadLetter {
    fn of(message: &BasicGetMessage, queue: &str) -> Self {
        let d = &message.delivery;
        let table = d.properties.headers().as_ref();
        let headers = table.map(headers_of).unwrap_or_default();
        let text = |k: &str| headers.get(k).cloned();
        let (session, turn) = ids_in(&d.data);
        // A letter the broker dead-lettered carries the client's headers as they were; only
        // the broker's newest death says where it came from and why.
        let death = table.and_then(broker_death);
        let by_broker = death.is_some();
        let ours = |k: &str| if by_broker { None } else { text(k) };
        let kind = d.properties.kind().as_ref().map(|k| k.to_string()).filter(|k| k != "dead");
        let (died_in, why) = death.map_or((None, None), |d| (d.queue, Some(d.reason)));
        DeadLetter {
            id: d.properties.message_id().as_ref().map(|m| m.to_string()).unwrap_or_default(),
            reason: ours(headers::REASON)
                .or_else(|| why.map(|r| format!("broker: {r}")))
                .unwrap_or_else(|| "unknown".to_owned()),
            stage: ours(headers::STAGE),
            original_queue: ours(headers::ORIGINAL_QUEUE).or(died_in),
            original_type: ours(headers::ORIGINAL_TYPE).or(kind),
            user: ours(headers::USER_ID),
            session_id: ours(headers::SESSION_ID).or(session),
            turn_id: ours(headers::TURN_ID).or(turn),
            // The worker's copy carries it in a header; the broker's keeps the property.
            reply_to: ours(headers::REPLY_TO).or_else(|| {
                let property = d.properties.reply_to().as_ref().map(|r| r.to_string());
                property.filter(|_| by_broker)
            }),
            body: d.data.clone(),
            body_bytes: d.data.len(),
            queue: queue.to_owned(),
            headers,
        }
    }

    /// The letter as a list keeps it: its body cut to [`LISTED_BODY`] bytes.
    fn listed(mut self) -> Self {
        self.body.truncate(LISTED_BODY);
        // Not mid-character: a text body stays text.
        if let Err(e) = std::str::from_utf8(&self.body) {
            if e.error_len().is_none() && self.body.len() < self.body_bytes {
                self.body.truncate(e.valid_up_to());
            }
        }
        self.body.shrink_to_fit();
        self
    }

    /// Whether the body is cut (a list's look at a larger one).
    pub fn body_cut(&self) -> bool {
        self.body.len() < self.body_bytes
    }

    /// The body as text when it is UTF-8.
    pub fn body_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}

/// Where and why the broker dead-lettered a letter.
struct Death {
    queue: Option<String>,
    reason: String,
}

/// The broker's newest death of a letter it dead-lettered; `None` for a worker's letter. The
/// broker always adds its death at the head of `x-death`, and writes `x-first-death-*` except
/// (RabbitMQ 3.10–3.12) on a message that already carried an `x-death`, which a client can set
/// on its request, together with forged `x-first-death-*`: so the head of `x-death` is read.
/// A worker's letter carries neither: it keeps only text and number headers (`headers_of`).
fn broker_death(table: &FieldTable) -> Option<Death> {
    let text = |t: &FieldTable, k: &str| match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
        _ => None,
    };
    match table.inner().get("x-death") {
        Some(AMQPValue::FieldArray(deaths)) => match deaths.as_slice().first() {
            Some(AMQPValue::FieldTable(newest)) => Some(Death {
                queue: text(newest, "queue"),
                reason: text(newest, "reason").unwrap_or_else(|| "unknown".to_owned()),
            }),
            _ => Some(Death { queue: None, reason: "unknown".to_owned() }),
        },
        Some(_) => Some(Death { queue: None, reason: "unknown".to_owned() }),
        None => text(table, "x-first-death-reason")
            .map(|reason| Death { queue: text(table, "x-first-death-queue"), reason }),
    }
}

/// `SessionId` and `TurnId` at the top of a JSON body (requests and stage messages name them).
fn ids_in(body: &[u8]) -> (Option<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Ids {
        #[serde(rename = "SessionId", alias = "session_id")]
        session: Option<String>,
        #[serde(rename = "TurnId", alias = "turn_id")]
        turn: Option<String>,
    }
    match serde_json::from_slice::<Ids>(body) {
        Ok(ids) => (ids.session, ids.turn),
        Err(_) => (None, None),
    }
}

/// How an action on one dead letter ended.
#[derive(Debug)]
pub enum Settled {
    /// Replayed or discarded.
    Done(DeadLetter),
    /// No dead letter has that id now (or another operator holds it this moment).
    NotFound,
    /// Not allowed, with the reason; the dead letter stays.
    Refused(String),
}

/// What to do with one dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadAction {
    /// Publish it again where it came from, then remove it.
    Replay,
    /// Remove it.
    Discard,
}

impl Topology {
    /// Up to `limit` dead letters of `queues` (see [`Topology::dead_queues`]), each queue's
    /// oldest first, left in their queues, each with at most [`LISTED_BODY`] bytes of its body;
    /// no more once the letters read come to `bytes` (the broker sends each whole: a page that
    /// lists them must not move gigabytes). A queue that does not exist has none.
    pub async fn dead_letters(
        &self,
        publisher: &Publisher,
        queues: &[String],
        (limit, bytes): (usize, usize),
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut look = Look::new(publisher, queues);
        let mut out = Vec::new();
        let mut read_bytes = 0usize;
        let read = async {
            while out.len() < limit.min(MAX_LOOK) && read_bytes < bytes {
                let Some((queue, m)) = look.next().await? else { break };
                read_bytes = read_bytes.saturating_add(m.delivery.data.len());
                out.push(DeadLetter::of(&m, queue).listed());
            }
            Ok(())
        };
        let read: Result<(), BrokerError> = read.await;
        look.end().await;
        read.map(|()| out)
    }

    /// The dead letter `id` of `queues`, whole, if one of the first [`MAX_LOOK`] of its queue;
    /// left in its queue. Only that letter is kept while the others are read.
    pub async fn dead_letter(
        &self,
        publisher: &Publisher,
        queues: &[String],
        id: &str,
    ) -> Result<Option<DeadLetter>, BrokerError> {
        let mut look = Look::new(publisher, queues);
        let found = async {
            while let Some((queue, m)) = look.next().await? {
                if named(&m, id) {
                    return Ok(Some(DeadLetter::of(&m, queue)));
                }
            }
            Ok(None)
        };
        let found = found.await;
        look.end().await;
        found
    }

    /// Replays or discards the dead letter `id`, looked for in `queues`. `check` may refuse
    /// the action (its reason) before anything is published or removed; meanwhile the letter is
    /// held, so no other operator acts on it.
    pub async fn settle_dead<E: std::fmt::Display>(
        &self,
        publisher: &Publisher,
        queues: &[String],
        id: &str,
        action: DeadAction,
        check: impl FnOnce(&DeadLetter) -> Result<(), E>,
    ) -> Result<Settled, BrokerError> {
        let mut look = Look::new(publisher, queues);
        let settled = async {
            let (letter, m) = loop {
                let Some((queue, m)) = look.next().await? else { return Ok(Settled::NotFound) };
                if named(&m, id) {
                    break (DeadLetter::of(&m, queue), m);
                }
            };
            if let Err(reason) = check(&letter) {
                return Ok(Settled::Refused(reason.to_string()));
            }
            if action == DeadAction::Replay {
                publisher.publish(&self.replay_of(&letter)).await?;
            }
            crate::metrics::metrics().amqp("basic.ack");
            m.delivery.acker.ack(BasicAckOptions::default()).await?;
            Ok(Settled::Done(letter))
        };
        let settled = settled.await;
        // Everything read and not acked goes back to the head of its queue, in order.
        look.end().await;
        settled
    }

    /// Whether `queue` is the ingress queue or one of its partitions.
    pub fn is_ingress_queue(&self, queue: &str) -> bool {
        let requests = self.requests();
        queue == requests || queue.strip_prefix(&requests).is_some_and(|r| r.starts_with('.'))
    }

    /// The copy a replay publishes: to the entry exchange under its session for a request
    /// (the partition layout may have changed since), else to its stage's single queue (a
    /// partition it came from may belong to a layout no worker reads any more), with the
    /// runtime's counters and marks removed so it starts afresh.
    pub fn replay_of(&self, letter: &DeadLetter) -> OutMessage {
        let queue = letter.original_queue.clone().unwrap_or_default();
        let kind = letter.original_type.clone().unwrap_or_default();
        let to = self.inner_stage_destination("", &queue).unwrap_or_else(|| queue.clone());
        let mut msg = OutMessage::to_queue(to, &kind, letter.id.clone(), letter.body.clone());
        if self.is_ingress_queue(&queue) {
            msg.exchange = self.requests_exchange();
            msg.routing_key = letter.session_id.clone().unwrap_or_default();
            // Where its client reads its replies (a backend instance's queue); the ingress
            // checks it again as any client's.
            msg.reply_to = letter.reply_to.clone();
        }
        msg.headers = letter
            .headers
            .iter()
            .filter(|(k, _)| !is_runtime_mark(k))
            .map(|(k, v)| (k.clone(), v.as_str().into()))
            .collect();
        msg.header(headers::REPLAYED, "true")
    }
}

/// Headers the runtime sets on its way (retry counts, the dead letter's own marks, the broker's
/// death records), which a replayed copy must not carry.
fn is_runtime_mark(key: &str) -> bool {
    matches!(
        key,
        headers::ATTEMPT
            | headers::REDELIVERIES
            | headers::LAST_ERROR
            | headers::REASON
            | headers::STAGE
            | headers::ORIGINAL_QUEUE
            | headers::ORIGINAL_TYPE
            | headers::USER_ID
            | headers::BODY_BYTES
            | headers::REPLY_TO
            | headers::KIND
            | "x-delivery-count"
    ) || key.starts_with("x-first-death")
        || key.starts_with("x-last-death")
}

/// Whether `e` says the queue does not exist (a tenant's dead-letter queue before its first
/// letter).
fn is_missing(e: &BrokerError) -> bool {
    matches!(e, BrokerError::Amqp(e) if super::layout::is_not_found(e))
}

/// Whether `m` is the dead letter `id` (its `message_id`; a letter without one is `""`, as
/// [`DeadLetter::of`] names it), told without reading the rest of it.
fn named(m: &BasicGetMessage, id: &str) -> bool {
    m.delivery.properties.message_id().as_ref().map_or("", |m| m.as_str()) == id
}

/// A look at `queues` in turn, each from its head and at most [`MAX_LOOK`] of it, a channel of
/// its own per queue: reading a queue that does not exist closes its channel (and the queue is
/// passed over), and closing a channel returns what was read and not acked to the head of its
/// queue, in order. Ended with [`Look::end`].
struct Look<'a> {
    publisher: &'a Publisher,
    queues: std::slice::Iter<'a, String>,
    /// The queue being read, its channel, and how many of it were read.
    current: Option<(&'a str, Channel, usize)>,
}

impl<'a> Look<'a> {
    fn new(publisher: &'a Publisher, queues: &'a [String]) -> Self {
        Look { publisher, queues: queues.iter(), current: None }
    }

    /// The next message and its queue; none once every queue was read.
    async fn next(&mut self) -> Result<Option<(&'a str, BasicGetMessage)>, BrokerError> {
        loop {
            let (queue, ch, read) = match &mut self.current {
                Some(current) => current,
                None => {
                    let Some(queue) = self.queues.next() else { return Ok(None) };
                    let ch = self.publisher.scratch_channel().await?;
                    self.current.insert((queue.as_str(), ch, 0))
                }
            };
            let queue: &'a str = queue;
            if *read < MAX_LOOK {
                *read += 1;
                match get(ch, queue).await {
                    Ok(Some(m)) => return Ok(Some((queue, m))),
                    Ok(None) => {}
                    Err(e) if is_missing(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            self.close_current().await;
        }
    }

    async fn close_current(&mut self) {
        if let Some((_, ch, _)) = self.current.take() {
            let _ = ch.close(200, "looked".into()).await;
        }
    }

    /// Closes the channel of the queue being read.
    async fn end(mut self) {
        self.close_current().await;
    }
}

async fn get(ch: &Channel, queue: &str) -> Result<Option<BasicGetMessage>, BrokerError> {
    crate::metrics::metrics().amqp("basic.get");
    let options = BasicGetOptions { no_ack: false };
    Ok(ch.basic_get(queue.into(), options).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert(k.into(), v);
        }
        t
    }

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    #[test]
    fn only_the_brokers_newest_death_describes_a_letter_it_made() {
        assert!(broker_death(&table(vec![(headers::REASON, long("x"))])).is_none(), "a worker's");
        // A client's request that came with a forged `x-death` and `x-first-death-*`,
        // dead-lettered by the ingress queue: RabbitMQ 3.10 put its death first in `x-death`
        // and left the forged `x-first-death-*` as they were.
        let newest = table(vec![("queue", long("p.requests")), ("reason", long("expired"))]);
        let forged = table(vec![("queue", long("p.persist")), ("reason", long("rejected"))]);
        let deaths = vec![AMQPValue::FieldTable(newest), AMQPValue::FieldTable(forged)];
        let letter = table(vec![
            ("x-death", AMQPValue::FieldArray(deaths.into())),
            ("x-first-death-queue", long("p.persist")),
            ("x-first-death-reason", long("rejected")),
        ]);
        let death = broker_death(&letter).unwrap();
        assert_eq!(
            (death.queue.as_deref(), death.reason.as_str()),
            (Some("p.requests"), "expired")
        );
        let odd = broker_death(&table(vec![("x-death", AMQPValue::Boolean(true))])).unwrap();
        assert_eq!((odd.queue, odd.reason.as_str()), (None, "unknown"));
        let first = table(vec![("x-first-death-reason", long("maxlen"))]);
        assert_eq!(broker_death(&first).unwrap().reason, "maxlen");
    }
}
