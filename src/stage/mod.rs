//! The stage framework: the one shape every stage has ([`Stage`]), what it may answer
//! ([`Output`], [`StageError`]), the registry type that puts stages in order ([`Chain`]), and the
//! one adapter between a stage and the broker runtime ([`runner::Runner`]).
//!
//! A stage never names its successor and never sees the broker: it turns its input message into
//! its output message, and the chain decides where that goes.

mod chain;
mod route;
mod runner;
mod trip;

use std::future::Future;

pub use chain::{Builder, Chain, Context};
pub use route::{delta_message, BrokerDeltas, DeltaSink, Route};
pub use runner::{message_fingerprint, Ledger, Runner};

pub use crate::broker::TurnHint;

use crate::broker::Delivery;
use crate::contracts::{ApiError, ErrorCode, TenantName};
use crate::messages::{Hop, Message, Outgoing, PersistJob, Submission};

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
        async move { Ok(Output::finish(input.fail(vec![error]))) }
    }

    /// Checked once when a process starts the stage, before it consumes: a resource that can
    /// never work in this process (an embedded store another process holds) stops the start
    /// with the reason, instead of failing every message later.
    fn prepare(&self) -> impl Future<Output = Result<(), String>> + Send {
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
    fn decode(delivery: &Delivery) -> Result<Self, String>;

    /// Takes the turn's path so far, this delivery's hop last (see `messages::hops`).
    fn take_hops(&mut self, path: Vec<Hop>) {
        let _ = path;
    }

    /// The round trip this input becomes when its turn fails with `errors`.
    fn fail(self, errors: Vec<ApiError>) -> Option<PersistJob>;

    /// The tenant the input belongs to, when it says (a client's submission does not: its
    /// stage knows from the publisher).
    fn tenant(&self) -> Option<TenantName> {
        None
    }
}

impl<M: Message> Inbound for M {
    fn decode(delivery: &Delivery) -> Result<Self, String> {
        crate::messages::decode(&delivery.body)
    }

    fn take_hops(&mut self, path: Vec<Hop>) {
        Message::take_hops(self, path);
    }

    fn fail(self, errors: Vec<ApiError>) -> Option<PersistJob> {
        Message::fail(self, errors)
    }

    fn tenant(&self) -> Option<TenantName> {
        self.turn().tenant.clone()
    }
}

impl Inbound for Submission {
    fn decode(delivery: &Delivery) -> Result<Self, String> {
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
    fn fail(self, _errors: Vec<ApiError>) -> Option<PersistJob> {
        None
    }
}

/// What a stage hands on.
#[derive(Debug)]
pub struct Output<M> {
    /// For the next stage.
    pub next: Option<M>,
    /// A round trip that ends now, for the last stage (a failed turn).
    pub finish: Option<PersistJob>,
    /// Messages already committed (outbox rows, `outbox_ids`) or answering a submission.
    pub messages: Vec<Outgoing>,
    /// Outbox rows of `messages`, deleted once they are published.
    pub outbox_ids: Vec<i64>,
}

impl<M> Output<M> {
    /// Hands `message` to the next stage.
    pub fn next(message: M) -> Self {
        Output { next: Some(message), finish: None, messages: Vec::new(), outbox_ids: Vec::new() }
    }

    /// Ends the round trip now with `job` (or nothing, when there is nothing left to end).
    pub fn finish(job: Option<PersistJob>) -> Self {
        Output { next: None, finish: job, messages: Vec::new(), outbox_ids: Vec::new() }
    }

    /// Publishes `messages` that are in no outbox (a refusal, a stored reply sent again).
    pub fn publish(messages: Vec<Outgoing>) -> Self {
        Output { next: None, finish: None, messages, outbox_ids: Vec::new() }
    }

    /// Publishes committed outbox rows, then deletes them.
    pub fn committed(outbox_ids: Vec<i64>, messages: Vec<Outgoing>) -> Self {
        Output { next: None, finish: None, messages, outbox_ids }
    }
}

/// Why a stage could not produce its output, classified by what happens to the message.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A dependency is unavailable: the message is retried later, and when attempts run out
    /// the turn fails with the stage's [`Stage::EXHAUSTED`] code.
    #[error("transient: {0}")]
    Transient(String),
    /// An expected, short wait (the session's previous reply is still being published): retried
    /// like [`StageError::Transient`], but routine under load, so not worth an operator's look.
    #[error("waiting: {0}")]
    Wait(String),
    /// The turn ends with these client-visible errors (recorded and replied by the last stage).
    #[error("turn failed: {}", .0.iter().map(|e| e.message.as_str()).collect::<Vec<_>>().join("; "))]
    Fail(Vec<ApiError>),
    /// The message can never be handled (corrupt data, a permanent database error): it is
    /// dead-lettered with the reason now and its turn fails with an error reply.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The message must not be acted on (a step for a turn that is not running at that step):
    /// dead-lettered with the reason, nothing else; the turn is not this message's to end.
    #[error("refused: {0}")]
    Refused(String),
}

impl StageError {
    /// Stored data that can never be used (corrupt, or from an unknown version).
    pub fn unusable(what: impl std::fmt::Display) -> Self {
        StageError::Permanent(format!("unusable data: {what}"))
    }

    /// A turn that fails with one error.
    pub fn fail(error: ApiError) -> Self {
        StageError::Fail(vec![error])
    }
}

impl From<serde_json::Error> for StageError {
    fn from(e: serde_json::Error) -> Self {
        StageError::Permanent(format!("unusable data: {e}"))
    }
}
