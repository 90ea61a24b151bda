//! The stage framework: the one shape every stage has ([`Stage`]), what it may answer
//! ([`Output`], [`StageError`]), the registry type that puts stages in order ([`Chain`]), and the
//! one adapter between a stage and the broker runtime ([`runner::Runner`]).
//!
//! A stage never names its successor and never sees the broker: it turns its input message into
//! its output message, and the chain decides where that goes.

mod cause;
mod chain;
mod route;
mod runner;
pub mod timed;
mod trip;

use std::future::Future;

pub use cause::{Cause, StageError};
pub use chain::{Builder, Chain, Context};
pub use route::{delta_message, BrokerDeltas, DeltaSink, Route, RouteError};
pub use runner::{message_fingerprint, Ledger, Runner};

pub use crate::broker::TurnHint;

use crate::broker::Delivery;
use crate::contracts::{ApiError, ErrorCode, TenantName};
use crate::messages::{DecodeError, EndedRoundTrip, Hop, Message, Outgoing, Submission};
use crate::store::PendingOutbox;

/// One step of the pipeline: a typed input message in, a typed output message out.
pub trait Stage: Send + Sync + 'static {
    /// Queue suffix, configuration key, metric label and worker name (`retrieve`).
    const NAME: &'static str;
    /// What the client is told when this stage's retries run out.
    const EXHAUSTED: ErrorCode = ErrorCode::RetriesExhausted;
    /// What the stage consumes (decoded once, never re-validated).
    type In: Inbound;
    /// What it hands on to whatever stage the chain puts next.
    type Out: Message;

    /// Handles one input.
    fn run(
        &self,
        input: Self::In,
    ) -> impl Future<Output = Result<Output<Self::Out>, StageError>> + Send;

    /// The input can never be handled (retries spent, poison, data unusable): what ends its
    /// turn instead. By default the turn fails with `error` at the last stage.
    fn give_up(
        &self,
        input: Self::In,
        error: ApiError,
    ) -> impl Future<Output = Result<Output<Self::Out>, StageError>> + Send {
        async move { Ok(Output::Finish(input.fail(vec![error]))) }
    }

    /// Checked once when a process starts the stage, before it consumes: a resource that can
    /// never work in this process (an embedded store another process holds) stops the start
    /// with the reason, instead of failing every message later.
    fn prepare(&self) -> impl Future<Output = Result<(), Cause>> + Send {
        async { Ok(()) }
    }

    /// Inputs of one session are handled one at a time, in delivery order (the ingress stage:
    /// turns of a session are admitted in arrival order). Other stages need no order, because
    /// admission lets only one turn per session run at a time.
    const ORDERED: bool = false;

    /// The tenant whose dead-letter queue keeps `input` when it is given up. By default the
    /// one the input names.
    fn tenant(&self, input: &Self::In) -> Option<TenantName> {
        input.tenant()
    }

    /// The turn a body names when its headers do not say (client submissions): read once per
    /// delivery, for ordering, logs and traces.
    fn hint(body: &[u8]) -> TurnHint {
        let _ = body;
        TurnHint::default()
    }
}

/// A stage input, as decoded from a delivery.
pub trait Inbound: Sized + Send + Sync + 'static {
    /// Decodes a delivery; `Err` says why it never can be.
    fn decode(delivery: &Delivery) -> Result<Self, DecodeError>;

    /// Takes the turn's path so far, this delivery's hop last (see `messages::hops`).
    fn take_hops(&mut self, path: Vec<Hop>) {
        let _ = path;
    }

    /// The round trip this input becomes when its turn fails with `errors`.
    fn fail(self, errors: Vec<ApiError>) -> Option<EndedRoundTrip>;

    /// The tenant the input belongs to, when it says (a client's submission does not: its
    /// stage knows from the publisher).
    fn tenant(&self) -> Option<TenantName> {
        None
    }
}

impl<M: Message> Inbound for M {
    fn decode(delivery: &Delivery) -> Result<Self, DecodeError> {
        crate::messages::decode(&delivery.body)
    }

    fn take_hops(&mut self, path: Vec<Hop>) {
        Message::take_hops(self, path);
    }

    fn fail(self, errors: Vec<ApiError>) -> Option<EndedRoundTrip> {
        Message::fail(self, errors)
    }

    fn tenant(&self) -> Option<TenantName> {
        self.turn().tenant.clone()
    }
}

impl Inbound for Submission {
    fn decode(delivery: &Delivery) -> Result<Self, DecodeError> {
        Ok(Submission {
            body: delivery.body.clone(),
            message_id: delivery.message_id.clone(),
            reply_to: delivery.reply_to.clone(),
            user_id: delivery.user_id.clone(),
            kind: delivery.kind.clone(),
            redelivered: delivery.redelivered,
        })
    }

    /// A submission has no turn of its own to fail; the ingress stage gives up on its own.
    fn fail(self, _errors: Vec<ApiError>) -> Option<EndedRoundTrip> {
        None
    }
}

/// What a stage did with its input.
#[derive(Debug)]
pub enum Output<M> {
    /// Hands the message to the next stage.
    Next(M),
    /// Ends the round trip now: the last stage records it and replies (a failed turn); `None`
    /// when there is nothing left to end.
    Finish(Option<EndedRoundTrip>),
    /// Publishes messages that are in no outbox (a refusal, a stored reply sent again).
    Publish(Vec<Outgoing>),
    /// Publishes messages the stage's transaction committed to the outbox, then deletes their
    /// rows.
    Committed(PendingOutbox),
}
