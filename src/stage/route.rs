//! Where a stage's output goes: the chain decides the queues, this turns typed messages into
//! broker messages (ids, headers, reply routing). The only place stage messages meet AMQP.

use futures_util::future::BoxFuture;
use tracing::warn;

use super::Output;
use crate::broker::{HeaderValue, LazyPublisher, OutMessage, StageName, Topology};
use crate::contracts::{event_seq, headers, ReplyAddress, TurnKey};
use crate::llm::StreamDelta;
use crate::messages::{
    encode, AdmittedTurn, EndedRoundTrip, LegacyMessage, Message, Outgoing, Replay, ReplyOut,
};
use crate::store::{PendingOutbox, Store};

/// Where one stage's outputs go, from its place in the chain.
#[derive(Debug, Clone)]
pub struct Route {
    /// The stage.
    pub stage: StageName,
    /// The stage after it, if any.
    pub next: Option<StageName>,
    /// The stage a turn starts (or resumes) at after admission.
    pub start: StageName,
    /// The last stage, which ends round trips.
    pub finisher: StageName,
    /// Queue names.
    pub topology: Topology,
}

impl Route {
    /// The broker messages of `output`.
    pub fn messages<M: Message>(&self, output: Output<M>) -> Result<Vec<OutMessage>, RouteError> {
        match output {
            Output::Next(m) => {
                let next = self.next.ok_or(RouteError::LastStage(self.stage))?;
                Ok(vec![self.to_stage(next, &m)?])
            }
            Output::Finish(job) => job.iter().map(|j| self.to_stage(self.finisher, j)).collect(),
            Output::Publish(messages) | Output::Committed(PendingOutbox { messages, .. }) => {
                messages.into_iter().map(|m| self.outgoing(m)).collect()
            }
        }
    }

    /// `job` ending its round trip now, for the last stage.
    pub fn finish(&self, job: &EndedRoundTrip) -> Result<OutMessage, RouteError> {
        self.to_stage(self.finisher, job)
    }

    /// The broker message of one outbox message.
    pub fn outgoing(&self, m: Outgoing) -> Result<OutMessage, RouteError> {
        match m {
            Outgoing::Start(job) => self.to_stage::<AdmittedTurn>(self.start, &job),
            Outgoing::Reply(r) => Ok(self.reply(r)),
            Outgoing::ReplayedDelta(d) => Ok(self.replayed_delta(d)),
            Outgoing::Resumed(n) => Ok(self.resumed(n)),
            Outgoing::Legacy(l) => legacy(l),
        }
    }

    fn to_stage<M: Message>(&self, stage: StageName, m: &M) -> Result<OutMessage, RouteError> {
        let (key, step) = (&m.turn().key, m.turn().step);
        let id = format!("{stage}:{}:{}:{step}", key.session_id, key.turn_id);
        let body = encode(m).map_err(|source| RouteError::Unencodable { kind: M::KIND, source })?;
        let session = key.session_id.to_string();
        Ok(self
            .topology
            .stage_message(stage, "turn", id, body)
            .header(headers::SESSION_ID, session)
            .header(headers::TURN_ID, key.turn_id.to_string()))
    }

    /// A kept delta, sent again exactly as it was published (same id, body and headers).
    fn replayed_delta(&self, d: Replay) -> OutMessage {
        let body = serde_json::to_vec(&d.body).unwrap_or_default();
        let mut msg =
            delta_envelope(&self.topology, &d.key, d.step, d.seq.unwrap_or_default(), body);
        // Sent again only to a queue the client declared (§9a): never one nobody reads.
        msg.create_queue = false;
        msg.to(&d.to)
    }

    /// The notice that ends a resume's replay (`type` = `resumed`).
    fn resumed(&self, n: Replay) -> OutMessage {
        let (key, body) = (&n.key, serde_json::to_vec(&n.body).unwrap_or_default());
        let id = format!("resumed:{}:{}:{}", key.session_id, key.turn_id, n.tag);
        let mut msg = OutMessage::to_queue(key.session_id.to_string(), RESUMED, id, body)
            .header(headers::SESSION_ID, key.session_id.to_string())
            .header(headers::TURN_ID, key.turn_id.to_string())
            .header(headers::PROTOCOL, headers::PROTOCOL_VERSION);
        msg.exchange = self.topology.replies_exchange();
        msg.session = Some(key.session_id);
        msg.create_queue = false;
        msg.correlation_id = n.correlation_id;
        msg.to(&n.to)
    }

    /// A reply for its session's reply queue.
    pub fn reply(&self, r: ReplyOut) -> OutMessage {
        crate::metrics::metrics().json("serialize", "reply_body");
        let body = serde_json::to_vec(&r.body).unwrap_or_default();
        let turn = r.turn_id.as_deref().unwrap_or("-");
        let mut msg = OutMessage::to_queue(r.session.to_string(), "reply", r.message_id(), body)
            .header(headers::SESSION_ID, r.session.to_string())
            .header(headers::TURN_ID, turn)
            .header(headers::FINAL, r.outcome.ends_turn())
            .header(headers::OUTCOME, r.outcome.as_str())
            .header(headers::PROTOCOL, headers::PROTOCOL_VERSION);
        if let Some(step) = r.step {
            msg = msg.header(headers::STEP, i64::from(step));
            if r.tag == format!("step-{step}") {
                msg = msg.header(headers::EVENT_SEQ, event_seq(step, None));
            }
        }
        // AGN-033 fixes the reply body, so the session's name and expiry travel as headers.
        if let Some(name) = &r.session_name {
            msg = msg.header(headers::SESSION_NAME, name.as_str());
        }
        if let Some(expires) = r.session_expires {
            let at = expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            msg = msg.header(headers::SESSION_EXPIRES, at);
        }
        msg.exchange = self.topology.replies_exchange();
        msg.session = Some(r.session);
        msg.create_queue = r.create_queue;
        let to = r.address();
        msg.correlation_id = r.correlation_id;
        msg.to(&to)
    }
}

fn legacy(l: LegacyMessage) -> Result<OutMessage, RouteError> {
    let headers: std::collections::BTreeMap<String, HeaderValue> =
        serde_json::from_value(l.headers).map_err(RouteError::LegacyHeaders)?;
    let session = headers.get(headers::SESSION_ID).and_then(|s| s.as_text().parse().ok());
    let mut msg = OutMessage::to_queue(l.routing_key, &l.kind, l.message_id, l.body);
    msg.exchange = l.exchange;
    msg.headers = headers;
    msg.session = if l.declare_session { session } else { None };
    Ok(msg)
}

/// Why a stage's output has no broker message.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A stage handed a message on, but it is the last of the chain.
    #[error("{0} is the last stage")]
    LastStage(StageName),
    /// A message could not be encoded.
    #[error("unencodable {kind}: {source}")]
    Unencodable {
        /// Its kind.
        kind: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// An outbox row in the layout before `payload` holds unreadable headers.
    #[error("legacy outbox headers: {0}")]
    LegacyHeaders(serde_json::Error),
}

/// Where stream deltas of a call go while it runs.
pub trait DeltaSink: Send + Sync + std::fmt::Debug {
    /// Publishes one delta of round trip `step` of turn `key` to the reply queue at `to`; a
    /// lost delta is never fatal (the final reply carries the whole answer).
    fn publish<'a>(
        &'a self,
        key: &'a TurnKey,
        step: i32,
        to: &'a ReplyAddress,
        delta: &'a StreamDelta,
    ) -> BoxFuture<'a, ()>;
}

/// Stream deltas to the session's reply queue, on a broker connection of their own, each kept
/// in PostgreSQL first (up to a window per turn) so a client can resume the stream.
#[derive(Debug)]
pub struct BrokerDeltas {
    publisher: LazyPublisher,
    topology: Topology,
    keep: Option<(Store, u32)>,
}

impl BrokerDeltas {
    /// Deltas published with `publisher`, named by `topology`, the first `window` of each step
    /// kept in `store` (none when `window` is 0).
    pub fn new(publisher: LazyPublisher, topology: Topology, store: Store, window: u32) -> Self {
        BrokerDeltas { publisher, topology, keep: (window > 0).then_some((store, window)) }
    }
}

impl DeltaSink for BrokerDeltas {
    fn publish<'a>(
        &'a self,
        key: &'a TurnKey,
        step: i32,
        to: &'a ReplyAddress,
        delta: &'a StreamDelta,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let message = delta_message(&self.topology, key, step, delta).to(to);
            if let Some((store, window)) =
                self.keep.as_ref().filter(|(_, w)| delta.seq < u64::from(*w))
            {
                // Kept before it is published: a resume finds every kept delta a client can
                // miss. A slow database delays the stream at most this long per delta.
                let keep = store.keep_delta(key, step, delta.seq, &message.body);
                match tokio::time::timeout(KEEP_TIMEOUT, keep).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => warn!(%error, window, "stream delta not kept for resuming"),
                    Err(_) => {
                        warn!(window, "stream delta not kept for resuming: the database is slow")
                    }
                }
            }
            if let Err(error) = self.publisher.publish(message).await {
                warn!(%error, "stream delta not published");
            }
        })
    }
}

/// A stream delta as published to the session's reply queue: marked as a delta in the `type`
/// property, the `x-aptix-kind` header and the body.
pub fn delta_message(
    topology: &Topology,
    key: &TurnKey,
    step: i32,
    delta: &StreamDelta,
) -> OutMessage {
    let body = serde_json::json!({
        "Delta": true,
        "SessionId": key.session_id,
        "TurnId": key.turn_id,
        "Step": step,
        "Seq": delta.seq,
        "Event": delta.event,
    });
    delta_envelope(topology, key, step, delta.seq, serde_json::to_vec(&body).unwrap_or_default())
}

/// Longest wait for a delta to be kept before it is published without.
const KEEP_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// The `type` of the notice that ends a resume's replay.
pub const RESUMED: &str = "resumed";

/// Delta `seq` of `step` of a turn, with its body encoded, as the session's reply queue gets it.
fn delta_envelope(
    topology: &Topology,
    key: &TurnKey,
    step: i32,
    seq: u64,
    body: Vec<u8>,
) -> OutMessage {
    let id = format!("delta:{}:{}:{step}:{seq}", key.session_id, key.turn_id);
    let mut msg = OutMessage::to_queue(key.session_id.to_string(), "delta", id, body)
        .header(headers::SESSION_ID, key.session_id.to_string())
        .header(headers::TURN_ID, key.turn_id.to_string())
        .header(headers::STEP, i64::from(step))
        .header(headers::SEQ, seq)
        .header(headers::EVENT_SEQ, event_seq(step, Some(seq)))
        .header(headers::PROTOCOL, headers::PROTOCOL_VERSION);
    msg.exchange = topology.replies_exchange();
    msg.session = Some(key.session_id);
    msg
}
