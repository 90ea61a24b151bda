//! Settling one delivery: run the handler, publish what it returns with confirms, then ack; or
//! retry later, count a redelivery, dead-letter. Everything here decides what happens to a
//! message; `runtime` decides when messages arrive.
//!
//! Messages without an ordering key retry through the delay queues and count crash
//! redeliveries in a header of a re-published copy. Both re-publish at the tail of the queue,
//! which would put an ordered message (a turn of a session, at validate) behind later turns of
//! its key. Ordered messages therefore retry in place, holding their lane, and have their
//! redeliveries counted by the handler. Publishing what a handler returned is `forward`'s
//! business, giving a message up `give_up`'s.

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Acker;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod forward;
mod give_up;
mod publish;

pub use publish::publish_all;
use publish::{by_destination, publish_rest, publish_to_clients};

use super::replies::{keep_unrouted, Refused};
use super::settings::RuntimeSettings;
use super::{
    BrokerError, Delivery, Disposition, Handler, HeaderValue, MessageKeys, OutMessage, ParkError,
    Publisher, StageName, MAC_HEADER,
};
use crate::contracts::headers;

/// Everything settling needs besides the delivery.
pub(super) struct Settler<'a> {
    pub stage: StageName,
    pub handler: &'a dyn Handler,
    pub publisher: &'a Publisher,
    pub settings: &'a RuntimeSettings,
    /// Cuts an in-place retry wait short; the message then goes back to the broker.
    pub shutdown: &'a CancellationToken,
}

/// How a delivery ends.
enum Settled {
    /// Published and confirmed (or nothing to publish): ack. The outcome names what was
    /// published: `forwarded`, `retried`, `requeued` (a counted copy), `dead_lettered`.
    Done(&'static str),
    /// Left unacked (shutdown during an in-place wait): the broker returns it when the channel
    /// closes, together with every later message of the channel and in delivery order. A nack
    /// would return it alone, behind messages delivered before its redelivery, and a quorum
    /// queue hands returned messages out in that order.
    Released,
}

impl Settler<'_> {
    /// Handles one delivery end to end and acks it, or returns it to the broker.
    pub async fn settle(&self, d: Delivery, acker: &Acker) {
        let stage = self.stage.as_str();
        let _in_flight = crate::metrics::metrics().in_flight(stage);
        let trace = super::trace::trace_id_of(&d);
        let span = super::trace::hop_span(stage, &d, trace.as_deref());
        let parent = super::trace::parent_ids(&span, &d, trace);
        let ordered = self.handler.ordering_key(&d).is_some();
        let result =
            tracing::Instrument::instrument(self.run(d, ordered, &parent), span.clone()).await;
        let outcome = match &result {
            Ok(Settled::Done(outcome)) => outcome,
            Ok(Settled::Released) => "returned",
            Err(_) => "publish_failed",
        };
        crate::metrics::metrics().message(stage, outcome);
        super::trace::finish(&span, outcome, result.as_ref().err().map(ToString::to_string));
        drop(span);
        match result {
            Ok(Settled::Done(_)) => {
                // An ack on a channel recovered meanwhile fails: the broker redelivers.
                crate::metrics::metrics().amqp("basic.ack");
                if let Err(error) = acker.ack(BasicAckOptions::default()).await {
                    debug!(stage, %error, "ack failed, message will be redelivered");
                }
            }
            Ok(Settled::Released) => {}
            Err(error) => {
                warn!(stage, %error, "publish failed, message will be redelivered");
                tokio::time::sleep(Duration::from_millis(200)).await;
                crate::metrics::metrics().amqp("basic.nack");
                let _ = acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await;
            }
        }
    }

    /// Handles `d` as what it is: new, or redelivered. An ordered message is never nacked: a nack
    /// would return it behind the next message of its lane, which this worker already holds and
    /// would handle first. Its refused publishes are held in place (`forward`) until the worker
    /// stops, when it is left to the broker; any other failure is redelivered in place after a
    /// pause, counted.
    async fn run(
        &self,
        d: Delivery,
        ordered: bool,
        parent: &super::trace::Parent,
    ) -> Result<Settled, BrokerError> {
        if let Some(reason) = self.untrusted(&d) {
            warn!(stage = self.stage.as_str(), %reason, "dead-lettering an unauthenticated message");
            self.dead_letter_with(&d, &reason, vec![]).await?;
            return Ok(Settled::Done("unauthenticated"));
        }
        let mut result = match (d.redelivered, ordered) {
            (true, false) => return self.republish_counted(d).await,
            (false, false) => return self.handle(d, false, parent).await,
            (true, true) => self.redelivered_in_place(d.clone(), parent).await,
            (false, true) => self.handle(d.clone(), true, parent).await,
        };
        while let Err(error) = &result {
            // A refusal held until the worker stopped: already logged and counted (`forward`).
            if self.shutdown.is_cancelled() {
                return Ok(Settled::Released);
            }
            warn!(stage = self.stage.as_str(), %error, "publish failed, handling the message again in place");
            crate::metrics::metrics().message(self.stage.as_str(), "publish_failed");
            if self.paused(forward::FIRST_PAUSE).await {
                return Ok(Settled::Released);
            }
            // What a nack's redelivery would have been, where it stands: part of its output may
            // have gone, and it is counted, so a poison message is given up, not handled, again.
            let mut again = d.clone();
            again.redelivered = true;
            result = self.redelivered_in_place(again, parent).await;
        }
        result
    }

    /// Runs the handler, and for ordered messages its in-place retries. Messages it publishes
    /// carry `parent` as their parent span.
    async fn handle(
        &self,
        mut d: Delivery,
        ordered: bool,
        parent: &super::trace::Parent,
    ) -> Result<Settled, BrokerError> {
        let stage = self.stage.as_str();
        loop {
            match self.handler.handle(d.clone()).await {
                Disposition::Forward { mut messages, outbox_ids } => {
                    for m in &mut messages {
                        super::trace::stamp(m, &d, parent);
                    }
                    if let Some(end) = self.forward(&d, &messages, ordered).await? {
                        return Ok(end);
                    }
                    self.handler.published(outbox_ids).await;
                    return Ok(Settled::Done("forwarded"));
                }
                Disposition::Retry { reason } if ordered => {
                    if let Some(end) = self.wait_in_place(&mut d, reason).await? {
                        return Ok(end);
                    }
                }
                Disposition::Retry { reason } => return self.retry_later(d, reason).await,
                Disposition::DeadLetter { reason, messages } => {
                    warn!(stage, %reason, "dead-lettering message");
                    self.dead_letter_with(&d, &reason, messages).await?;
                    return Ok(Settled::Done("dead_lettered"));
                }
            }
        }
    }

    /// Waits out the retry tier of an ordered message's next attempt, holding its lane. `None`:
    /// try again now; otherwise how the message ended (given up, or returned on shutdown).
    async fn wait_in_place(
        &self,
        d: &mut Delivery,
        reason: String,
    ) -> Result<Option<Settled>, BrokerError> {
        let Some((next, tier)) = self.next_attempt(d, &reason).await? else {
            return Ok(Some(Settled::Done("dead_lettered")));
        };
        info!(stage = self.stage.as_str(), attempt = next, delay_ms = tier, %reason, "retrying in place");
        d.attempt = next;
        let stopped = self.paused(Duration::from_millis(tier)).await;
        Ok(stopped.then_some(Settled::Released))
    }

    /// A redelivered ordered message: counted by the handler, then handled where it stands.
    async fn redelivered_in_place(
        &self,
        d: Delivery,
        parent: &super::trace::Parent,
    ) -> Result<Settled, BrokerError> {
        loop {
            match self.handler.count_redelivery(&d).await {
                Ok(Some(count)) if count > self.settings.max_redeliveries => {
                    return self.poison(d, count).await
                }
                Ok(_) => return self.handle(d, true, parent).await,
                // Returning it to the broker would let the next message of its lane overtake it.
                Err(reason) => {
                    warn!(stage = self.stage.as_str(), %reason, "could not count a redelivery, trying again");
                    if self.paused(forward::FIRST_PAUSE).await {
                        return Ok(Settled::Released);
                    }
                }
            }
        }
    }

    /// Waits `pause` before an ordered message is tried again in place; `true` when shutdown
    /// (or the end of the connection) cut the wait short.
    async fn paused(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => true,
            _ = tokio::time::sleep(pause) => false,
        }
    }

    /// A redelivered unordered message: re-published with its count so crash loops are bounded.
    async fn republish_counted(&self, d: Delivery) -> Result<Settled, BrokerError> {
        // An unreadable count (not one of ours) counts as spent; a count never wraps to 0.
        let seen = d
            .headers
            .get(headers::REDELIVERIES)
            .map_or(0, |c| c.parse::<u32>().unwrap_or(u32::MAX));
        let count = seen.saturating_add(1);
        if count > self.settings.max_redeliveries {
            return self.poison(d, count).await;
        }
        let copy = self.counted(copy_of(d, &self.copies_to(), headers::REDELIVERIES, count));
        self.publish(&[copy]).await?;
        Ok(Settled::Done("requeued"))
    }

    /// A transient failure of an unordered message: to a delay queue, or given up.
    async fn retry_later(&self, d: Delivery, reason: String) -> Result<Settled, BrokerError> {
        let Some((next, tier)) = self.next_attempt(&d, &reason).await? else {
            return Ok(Settled::Done("dead_lettered"));
        };
        info!(stage = self.stage.as_str(), attempt = next, delay_ms = tier, %reason, "retrying later");
        let mut copy = copy_of(d, &self.copies_to(), headers::ATTEMPT, next);
        copy.exchange = self.settings.topology.delay_exchange(tier);
        copy.headers.insert(headers::LAST_ERROR.into(), reason.into());
        self.publish(&[self.counted(copy)]).await?;
        Ok(Settled::Done("retried"))
    }

    /// The next attempt's number and its delay tier (ms), or `None` once the message was given
    /// up because its attempts ran out.
    async fn next_attempt(
        &self,
        d: &Delivery,
        reason: &str,
    ) -> Result<Option<(u32, u64)>, BrokerError> {
        let next = d.attempt.saturating_add(1);
        if next >= self.settings.max_attempts {
            warn!(stage = self.stage.as_str(), attempts = next, %reason, "retries exhausted");
            self.give_up(d.clone(), format!("retries exhausted: {reason}")).await?;
            return Ok(None);
        }
        Ok(Some((next, super::retry_tier_ms(d.attempt))))
    }

    /// `copy` with a MAC over its counts when it goes back to the ingress, which keeps the
    /// counters of a client's message only with one (`delivery::keep_client_headers`).
    fn counted(&self, copy: OutMessage) -> OutMessage {
        let ingress = self.settings.topology.is_ingress(self.stage);
        let Some(keys) = self.settings.keys.as_ref().filter(|_| ingress) else { return copy };
        let count = |k: &str| copy.headers.get(k).map(HeaderValue::as_text).unwrap_or_default();
        let (attempt, redeliveries) = (count(headers::ATTEMPT), count(headers::REDELIVERIES));
        let mac = keys.sign(&super::ingress_count_fields(&attempt, &redeliveries), &copy.body);
        copy.header(MAC_HEADER, mac)
    }

    /// Why a delivery of a stage after the ingress is not the pipeline's own (see `mac`).
    fn untrusted(&self, d: &Delivery) -> Option<String> {
        let keys = self.settings.keys.as_ref()?;
        if self.settings.topology.is_ingress(self.stage) {
            return None;
        }
        unauthenticated(keys, &self.queue(), d)
    }

    fn queue(&self) -> String {
        self.settings.topology.stage_queue(self.stage)
    }

    /// Where copies of a message go (a counted redelivery, a retry through a delay tier): the
    /// stage's queue, or a partitioned ingress's first partition, since `P.requests` does not
    /// exist then (a copy sent there came back unroutable, for ever on classic queues, or was
    /// dropped by its delay tier). Only requests without a session are copied at the ingress
    /// (a session's retry in place, in order), so any partition will do.
    fn copies_to(&self) -> String {
        let topology = &self.settings.topology;
        if topology.is_ingress(self.stage) {
            if let Some(first) = topology.ingress_queues().into_iter().next() {
                return first;
            }
        }
        self.queue()
    }

    /// Publishes `messages`; the replies their client's queue refused are parked in PostgreSQL
    /// (delivered later, `crate::redeliver`), and the delivery goes on: the client's queue cost
    /// it nothing. A database that cannot take them for a while is waited for ([`Self::park`]),
    /// for as long as it takes.
    async fn publish(&self, messages: &[OutMessage]) -> Result<(), BrokerError> {
        let mut part = ClientsPart::default();
        loop {
            // Held until the replies park, as an ordered message is: re-handled through the
            // delay tiers it would offer its delivered replies again, and a dead letter each
            // time round while the database stays down.
            match self.publish_from(messages, &mut part).await {
                Err(BrokerError::NotParked(_)) if !self.shutdown.is_cancelled() => {}
                other => return other,
            }
        }
    }

    /// [`Self::publish`], the clients' part taken up where an earlier try left it (`part`), so
    /// that a try again after the rest failed neither offers a handed reply again nor parks a
    /// refused one a second time.
    async fn publish_from(
        &self,
        messages: &[OutMessage],
        part: &mut ClientsPart,
    ) -> Result<(), BrokerError> {
        let (to_clients, rest) = by_destination(messages);
        if matches!(part, ClientsPart::NotOffered) {
            let refused = publish_to_clients(self.publisher, self.settings, &to_clients).await?;
            *part = ClientsPart::Refused(refused);
        }
        if let ClientsPart::Refused(refused) = part {
            // Parked before the rest goes: the rest may start the session's next turn, whose
            // replies must find them parked and wait behind them.
            self.park(refused).await?;
            *part = ClientsPart::Handed;
        }
        publish_rest(self.publisher, self.settings, &rest).await
    }

    /// Parks `refused`. A database that cannot take them now is tried again, backing off, for
    /// [`PARK_PATIENCE`], then `NotParked` (the caller tries again where it stands, these
    /// replies not offered twice); one that never will (a permanent error) has them kept in
    /// `<prefix>.unrouted`, so a reply the store refuses holds nothing up.
    async fn park(&self, refused: &[Refused]) -> Result<(), BrokerError> {
        if refused.is_empty() {
            return Ok(());
        }
        let (since, mut pause) = (std::time::Instant::now(), forward::FIRST_PAUSE);
        loop {
            let error = match self.handler.park(refused.to_vec()).await {
                Ok(()) => {
                    crate::metrics::metrics().message(self.stage.as_str(), "reply_parked");
                    // Known here at once, not at the next look at PostgreSQL: this process's
                    // next replies to those queues park behind them.
                    refused.iter().for_each(|r| super::replies::mark_waiting(&r.queue));
                    return Ok(());
                }
                Err(ParkError::Permanent(error)) => {
                    warn!(stage = self.stage.as_str(), %error, "refused replies cannot be parked, keeping them in the unrouted queue");
                    for r in refused {
                        keep_unrouted(
                            self.publisher,
                            &self.settings.topology,
                            &r.message,
                            &r.reason,
                        )
                        .await?;
                    }
                    return Ok(());
                }
                Err(ParkError::Transient(error)) => error,
            };
            if since.elapsed() >= PARK_PATIENCE || self.paused(pause).await {
                return Err(BrokerError::NotParked(error.to_string()));
            }
            warn!(stage = self.stage.as_str(), %error, "refused replies not parked yet, trying again");
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

/// How long one wait for the database to park refused replies lasts before its caller hears of
/// it (and waits again, where it stands).
const PARK_PATIENCE: Duration = Duration::from_secs(60);

/// How far a delivery's messages to clients' queues got, kept across tries of its publish.
#[derive(Debug, Default)]
pub(super) enum ClientsPart {
    /// Not offered yet.
    #[default]
    NotOffered,
    /// Offered; these were refused and wait to be parked.
    Refused(Vec<Refused>),
    /// Handed over or parked.
    Handed,
}

/// The delivery re-published to `queue` with `counter` set to `value`.
fn copy_of(d: Delivery, queue: &str, counter: &str, value: u32) -> OutMessage {
    let mut copy = OutMessage::to_queue(
        queue.to_owned(),
        "turn",
        d.message_id.clone().unwrap_or_default(),
        d.body.to_vec(),
    );
    copy.headers = d.headers.into_iter().map(|(k, v)| (k, v.into())).collect();
    copy.headers.insert(counter.into(), value.into());
    copy.headers.remove(headers::KIND);
    copy
}

/// Why `d`, consumed from `queue`, is not to be trusted: a stage queue's message without a MAC
/// that verifies under `keys`.
fn unauthenticated(keys: &MessageKeys, queue: &str, d: &Delivery) -> Option<String> {
    let kind = d.kind.as_deref().unwrap_or_default();
    match d.headers.get(MAC_HEADER) {
        None => Some(format!("unauthenticated: no {MAC_HEADER} header")),
        Some(mac) if keys.verify(&super::stage_mac_fields(kind, queue), &d.body, mac) => None,
        Some(_) => Some(format!("unauthenticated: {MAC_HEADER} does not verify")),
    }
}
