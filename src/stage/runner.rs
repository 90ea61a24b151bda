//! The one adapter between a [`Stage`] and the broker runtime: decode the input once, run the
//! stage, route its output, and turn each error class into what happens to the message.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt as _;
use sha2::{Digest as _, Sha256};
use tracing::{debug, warn};

use super::trip::Trip;
use super::{Inbound, Output, Route, Stage, StageError, TurnHint};
use crate::broker::{
    BoxError, Delivery, Disposition, Handler, OutMessage, ParkError, Refused, UNDELIVERABLE,
};
use crate::contracts::{ApiError, ErrorCode};
use crate::store::{ParkReply, StoreError};

/// Tries to delete published outbox rows (about a minute of a database outage).
const DELETE_ATTEMPTS: u32 = 15;

/// What the runtime's bookkeeping needs from the database, without the stage framework
/// knowing the store.
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Deletes outbox rows whose messages were confirmed.
    fn delete_outbox(&self, ids: Vec<i64>) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Counts, durably, one more delivery of the message named `key`; returns the total.
    fn count_redelivery(&self, key: String) -> BoxFuture<'_, Result<u32, StoreError>>;
    /// Parks replies their client's queue refused, to be delivered later.
    fn park(&self, replies: Vec<ParkReply>) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// A stage as the broker runtime sees it.
#[derive(Debug)]
pub struct Runner<S> {
    stage: S,
    route: Route,
    ledger: Arc<dyn Ledger>,
}

impl<S: Stage> Runner<S> {
    /// Runs `stage`, sending its outputs along `route`.
    pub fn new(stage: S, route: Route, ledger: Arc<dyn Ledger>) -> Self {
        Runner { stage, route, ledger }
    }

    async fn handle_typed(&self, d: Delivery) -> Disposition {
        let trip = Trip::start(S::NAME, &d);
        let mut input = match S::In::decode(&d) {
            Ok(i) => i,
            Err(e) => return Disposition::DeadLetter { reason: e.to_string(), messages: vec![] },
        };
        input.take_hops(trip.path());
        match self.stage.run(input).await {
            Ok(output) => self.forward(output, &trip),
            Err(e) => self.failed(&d, e, &trip).await,
        }
    }

    fn forward(&self, output: Output<S::Out>, trip: &Trip) -> Disposition {
        let outbox_ids = match &output {
            Output::Committed(pending) => pending.ids.clone(),
            _ => Vec::new(),
        };
        match self.route.messages(output) {
            Ok(mut messages) => {
                messages.iter_mut().for_each(|m| trip.stamp(m));
                Disposition::Forward { messages, outbox_ids }
            }
            Err(e) => Disposition::DeadLetter { reason: e.to_string(), messages: vec![] },
        }
    }

    async fn failed(&self, d: &Delivery, error: StageError, trip: &Trip) -> Disposition {
        let stage = S::NAME;
        match error {
            StageError::Wait(cause) => {
                debug!(stage, reason = %cause, "waiting, retrying later");
                Disposition::Retry { reason: cause.to_string() }
            }
            StageError::Transient(cause) => {
                warn!(stage, reason = %cause, "transient failure");
                Disposition::Retry { reason: cause.to_string() }
            }
            StageError::Fail(errors) => {
                // The input decoded a moment ago; it decodes again.
                let job = S::In::decode(d).ok().and_then(|i| i.fail(errors));
                self.forward(Output::Finish(job), trip)
            }
            StageError::Permanent(cause) => {
                warn!(stage, reason = %cause, "permanent failure, failing the turn");
                let error = ApiError::new(
                    cause.code().unwrap_or(ErrorCode::Internal),
                    format!("the {stage} stage could not use this turn's data; an operator has the details"),
                );
                let messages = self.give_up(d, error).await;
                Disposition::DeadLetter { reason: cause.to_string(), messages }
            }
            StageError::Refused(cause) => {
                Disposition::DeadLetter { reason: cause.to_string(), messages: vec![] }
            }
        }
    }

    /// The messages that end an input's turn with `error` (nothing if it cannot be decoded).
    /// A stage whose own ending panics (the bug its handling met, met again) has its turn ended
    /// the way a stage that says nothing ends one: its client still gets the error reply.
    async fn give_up(&self, d: &Delivery, error: ApiError) -> Vec<OutMessage> {
        let Ok(input) = S::In::decode(d) else { return vec![] };
        let ending = AssertUnwindSafe(self.stage.give_up(input, error.clone())).catch_unwind();
        let output = match ending.await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                tracing::error!(stage = S::NAME, error = %e, "could not end a given-up message's turn");
                return vec![];
            }
            Err(_) => {
                tracing::error!(
                    stage = S::NAME,
                    "ending a given-up message's turn panicked; ended without the stage"
                );
                // It decoded a moment ago; it decodes again.
                let Ok(input) = S::In::decode(d) else { return vec![] };
                Output::Finish(input.fail(vec![error]))
            }
        };
        // Outbox rows of a give-up are published with the dead letter and stay until a
        // redelivery of the turn finds them (consumers drop the copy by message id).
        match self.route.messages(output) {
            Ok(mut messages) => {
                let trip = Trip::start(S::NAME, d);
                messages.iter_mut().for_each(|m| trip.stamp(m));
                messages
            }
            Err(reason) => {
                tracing::error!(stage = S::NAME, %reason, "could not route a given-up message's turn");
                vec![]
            }
        }
    }
}

impl<S: Stage> Handler for Runner<S> {
    fn handle(&self, delivery: Delivery) -> BoxFuture<'_, Disposition> {
        Box::pin(self.handle_typed(delivery))
    }

    fn exhausted(&self, delivery: Delivery, reason: String) -> BoxFuture<'_, Vec<OutMessage>> {
        Box::pin(async move {
            let code = if reason.starts_with(UNDELIVERABLE) {
                ErrorCode::Undeliverable
            } else {
                S::EXHAUSTED
            };
            let error = ApiError::new(code, format!("the {} stage gave up: {reason}", S::NAME));
            self.give_up(&delivery, error).await
        })
    }

    fn prepare(&self) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move { Ok(self.stage.prepare().await?) })
    }

    fn hint(&self, body: &[u8]) -> TurnHint {
        S::hint(body)
    }

    fn tenant(&self, delivery: &Delivery) -> Option<crate::contracts::TenantName> {
        let input = S::In::decode(delivery).ok()?;
        self.stage.tenant(&input)
    }

    fn ordering_key(&self, delivery: &Delivery) -> Option<String> {
        if S::ORDERED {
            delivery.hint.session.clone()
        } else {
            None
        }
    }

    fn count_redelivery(
        &self,
        delivery: &Delivery,
    ) -> BoxFuture<'_, Result<Option<u32>, BoxError>> {
        let key = message_fingerprint(delivery.message_id.as_deref(), &delivery.body);
        Box::pin(async move { Ok(Some(self.ledger.count_redelivery(key).await?)) })
    }

    fn park(&self, refused: Vec<Refused>) -> BoxFuture<'_, Result<(), ParkError>> {
        Box::pin(async move {
            let replies = refused.iter().map(park_reply).collect::<Result<Vec<_>, _>>();
            let replies = replies.map_err(|e| ParkError::Permanent(e.into()))?;
            self.ledger.park(replies).await.map_err(|e| {
                if e.is_transient() {
                    ParkError::Transient(e.into())
                } else {
                    ParkError::Permanent(e.into())
                }
            })
        })
    }

    fn published(&self, outbox_ids: Vec<i64>) -> BoxFuture<'_, ()> {
        // The message is acked once its outputs are confirmed, so nothing redelivers it to find
        // rows left behind: deleting them is retried in the background through a database
        // restart, without holding up the ack.
        let ledger = self.ledger.clone();
        tokio::spawn(async move {
            let mut delay = std::time::Duration::from_millis(200);
            for attempt in 1..=DELETE_ATTEMPTS {
                match ledger.delete_outbox(outbox_ids.clone()).await {
                    Ok(()) => return,
                    Err(error) if attempt == DELETE_ATTEMPTS => {
                        // Left rows are only published again if their turn is found again;
                        // consumers drop copies by message id.
                        warn!(%error, rows = outbox_ids.len(), "could not delete published outbox rows");
                    }
                    Err(_) => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        });
        Box::pin(async {})
    }
}

/// A stable name for one delivered message: the same for each redelivery of it, different for
/// another submission (another message id, or other bytes).
pub fn message_fingerprint(message_id: Option<&str>, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(message_id.unwrap_or_default().as_bytes());
    hash.update([0]);
    hash.update(body);
    hex::encode(&hash.finalize()[..12])
}

/// `value` with every NUL in its strings and keys replaced by U+FFFD.
fn without_nul(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => *s = s.replace('\0', "\u{fffd}"),
        Value::Array(items) => items.iter_mut().for_each(without_nul),
        Value::Object(map) if map.keys().any(|k| k.contains('\0')) => {
            let taken = std::mem::take(map);
            for (k, mut v) in taken {
                without_nul(&mut v);
                map.insert(k.replace('\0', "\u{fffd}"), v);
            }
        }
        Value::Object(map) => map.values_mut().for_each(without_nul),
        _ => {}
    }
}

/// A refused reply as its parked row holds it.
pub fn park_reply(r: &Refused) -> Result<ParkReply, serde_json::Error> {
    let mut message = serde_json::to_value(&r.message)?;
    // PostgreSQL's `jsonb` holds no NUL, which a client may put in what a reply repeats (its
    // message id, as the reply's correlation id): such a reply would never park.
    without_nul(&mut message);
    Ok(ParkReply {
        queue: r.queue.clone(),
        session: r.message.session.map(|s| s.as_uuid()),
        tenant: r.message.tenant.as_ref().map(ToString::to_string),
        instance: r.message.instance.is_some(),
        message,
        reason: r.reason.clone(),
    })
}
