//! The five stages. Each is a plain async function from one typed message to the next
//! (`validate::run`, `retrieve::run`, `assemble::run`, `invoke::run`, `persist::run`); the
//! [`StageHandler`] glue decodes, calls, encodes and classifies errors for the broker runtime.

pub mod assemble;
pub mod invoke;
pub mod persist;
pub mod retrieve;
pub mod validate;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tracing::warn;

use crate::broker::{Delivery, Disposition, Handler, OutMessage, StageName, Topology};
use crate::config::{AgentContext, ConversationContext, Settings};
use crate::contracts::{ApiError, ErrorCode, Reply, SessionId, TurnKey, UserTurn, ValidatedRequest};
use crate::llm::LlmClient;
use crate::messages::{PersistJob, RoundTrip, StageMessage, TurnJob};
use crate::retrieve::Retrieval;
use crate::store::Store;

/// What every stage may use. Built once per process and shared.
#[derive(Debug, Clone)]
pub struct Deps {
    /// Validated configuration.
    pub settings: Arc<Settings>,
    /// PostgreSQL.
    pub store: Store,
    /// Queue names.
    pub topology: Topology,
    /// The vector store(s).
    pub retrieval: Retrieval,
    /// The LLM.
    pub llm: Arc<dyn LlmClient>,
    /// Where stream deltas go, when streaming is wired.
    pub deltas: Option<Arc<dyn DeltaPublisher>>,
}

/// Publishes stream deltas of a turn to its session (implemented over the broker by the runtime).
pub trait DeltaPublisher: Send + Sync + std::fmt::Debug {
    /// Publishes one delta message; errors are logged, never fatal to the turn.
    fn publish(&self, message: OutMessage) -> BoxFuture<'_, ()>;
}

/// Why a stage could not produce its output, classified by what happens to the message.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A dependency is unavailable; the message is retried later.
    #[error("transient: {0}")]
    Transient(String),
    /// The message can never be handled (corrupt data, a permanent database error): it is
    /// dead-lettered with the reason now and its turn fails with an error reply.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The message must not be acted on (a step for a turn that is not running at that step):
    /// dead-lettered with the reason, nothing else; the turn is not this message's to end.
    #[error("refused: {0}")]
    Refused(String),
}

impl From<crate::store::StoreError> for StageError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::NotRunning { .. } => StageError::Refused(e.to_string()),
            e if e.is_transient() => StageError::Transient(e.to_string()),
            e => StageError::Permanent(e.to_string()),
        }
    }
}

impl From<serde_json::Error> for StageError {
    fn from(e: serde_json::Error) -> Self {
        StageError::Permanent(format!("unusable data: {e}"))
    }
}

impl Deps {
    /// The ConversationContext of a user turn.
    pub fn conversation_context(&self, turn: &UserTurn) -> Result<&ConversationContext, ApiError> {
        self.settings.conversation_context(turn.conversation_context_id()).ok_or_else(|| {
            ApiError::at(
                ErrorCode::UnknownConversationContext,
                "ConversationContextId",
                format!(
                    "no conversation context `{}` is configured",
                    turn.conversation_context_id().map_or("(default)", |c| c.as_str())
                ),
            )
        })
    }

    /// The AgentContext of a user turn.
    pub fn agent_context(&self, turn: &UserTurn) -> Result<&AgentContext, ApiError> {
        self.settings.agent_context(turn.agent_context_id()).ok_or_else(|| {
            ApiError::at(
                ErrorCode::UnknownAgentContext,
                "AgentContextId",
                format!(
                    "no agent context `{}` is configured",
                    turn.agent_context_id().map_or("(default)", |c| c.as_str())
                ),
            )
        })
    }

    /// The message that hands `msg` to stage `next`.
    pub fn to_stage(&self, next: StageName, msg: &StageMessage) -> OutMessage {
        let key = msg.key();
        let id = format!("{}:{}:{}:{}", next.as_str(), key.session_id, key.turn_id, msg.job().step);
        let body = serde_json::to_vec(msg).unwrap_or_default();
        OutMessage::to_queue(self.topology.stage_queue(next), "turn", id, body)
            .header("x-aptix-session-id", key.session_id.to_string())
            .header("x-aptix-turn-id", key.turn_id.to_string())
    }

    /// The reply of a round trip, for the session's reply queue. `tag` makes the message id
    /// stable for the same logical reply (`step-0`, `rejected-<fingerprint>`, ...); a `step-N`
    /// tag marks the reply that ends step N of the turn.
    pub fn reply(&self, session: &SessionId, turn_id: Option<&str>, tag: &str, reply: &Reply) -> OutMessage {
        let outcome = ReplyOutcome::of(reply, tag.starts_with("step-"));
        self.reply_bytes(session, turn_id, tag, outcome, serde_json::to_vec(reply).unwrap_or_default())
    }

    /// Like [`Deps::reply`], for a reply already serialized (a stored one sent again).
    pub fn reply_bytes(
        &self,
        session: &SessionId,
        turn_id: Option<&str>,
        tag: &str,
        outcome: ReplyOutcome,
        body: Vec<u8>,
    ) -> OutMessage {
        let turn = turn_id.unwrap_or("-");
        let mut msg =
            OutMessage::to_queue(session.to_string(), "reply", format!("reply:{session}:{turn}:{tag}"), body)
                .header("x-aptix-session-id", session.to_string())
                .header("x-aptix-turn-id", turn)
                .header("x-aptix-final", outcome != ReplyOutcome::ClientToolContinuation)
                .header("x-aptix-outcome", outcome.as_str());
        if let Some(step) = tag.strip_prefix("step-").and_then(|n| n.parse::<i64>().ok()) {
            msg = msg.header("x-aptix-step", step);
        }
        msg.exchange = self.topology.replies_exchange();
        msg.session = Some(*session);
        msg
    }
}

/// What a reply tells its client, sent as the `x-aptix-outcome` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// The turn ended with an answer.
    Final,
    /// The turn waits for the client's tool results.
    ClientToolContinuation,
    /// The turn ended in failure.
    Failed,
    /// This submission was refused; no turn changed.
    Refused,
}

impl ReplyOutcome {
    /// Of a reply that ends a step (`step`), or that answers a submission.
    pub fn of(reply: &Reply, step: bool) -> Self {
        match (reply.result(), step) {
            (Some(r), _) if matches!(r.outcome, crate::contracts::Outcome::ClientToolContinuation(_)) => {
                ReplyOutcome::ClientToolContinuation
            }
            (Some(_), _) => ReplyOutcome::Final,
            (None, true) => ReplyOutcome::Failed,
            (None, false) => ReplyOutcome::Refused,
        }
    }

    /// Of a stored step reply sent again.
    pub fn of_stored(reply: &serde_json::Value) -> Self {
        let kind = reply.pointer("/Result/Kind").and_then(serde_json::Value::as_str);
        match kind {
            Some("client_tool_continuation") => ReplyOutcome::ClientToolContinuation,
            Some(_) => ReplyOutcome::Final,
            None => ReplyOutcome::Failed,
        }
    }

    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyOutcome::Final => "final",
            ReplyOutcome::ClientToolContinuation => "client_tool_continuation",
            ReplyOutcome::Failed => "failed",
            ReplyOutcome::Refused => "refused",
        }
    }
}

/// The user turn inside a job (a job always carries one).
pub fn user_turn(job: &TurnJob) -> Option<&UserTurn> {
    match &job.turn {
        ValidatedRequest::UserTurn(t) => Some(t),
        ValidatedRequest::ToolContinuation(_) => None,
    }
}

/// A persist job that fails the turn with `errors`.
pub fn failed(job: TurnJob, errors: Vec<ApiError>) -> StageMessage {
    StageMessage::Persist(PersistJob {
        job,
        assembled: None,
        warnings: Vec::new(),
        result: RoundTrip::Failed { errors, raw: None },
    })
}

/// Adapts a typed stage function to the broker runtime.
#[derive(Debug)]
pub struct StageHandler {
    stage: StageName,
    deps: Arc<Deps>,
}

impl StageHandler {
    /// The handler of `stage`.
    pub fn new(stage: StageName, deps: Arc<Deps>) -> Self {
        StageHandler { stage, deps }
    }

    async fn handle_typed(&self, d: Delivery) -> Disposition {
        if self.stage == StageName::Validate {
            return validate::run(&self.deps, &d.body, d.message_id.as_deref()).await;
        }
        let msg: StageMessage = match serde_json::from_slice(&d.body) {
            Ok(m) => m,
            Err(e) => {
                return Disposition::DeadLetter {
                    reason: format!("undecodable stage message: {e}"),
                    messages: vec![],
                }
            }
        };
        let key: TurnKey = msg.key().clone();
        let result = match (self.stage, msg) {
            (StageName::Retrieve, StageMessage::Retrieve(job)) => {
                self.next(retrieve::run(&self.deps, job).await)
            }
            (StageName::Assemble, StageMessage::Assemble(job)) => {
                self.next(assemble::run(&self.deps, job).await)
            }
            (StageName::Invoke, StageMessage::Invoke(job)) => self.next(invoke::run(&self.deps, job).await),
            (StageName::Persist, StageMessage::Persist(job)) => persist::run(&self.deps, job)
                .await
                .map(|outbox| Disposition::Forward { messages: outbox.messages, outbox_ids: outbox.ids }),
            (stage, other) => {
                let reason = format!("{} cannot handle a {:?} message", stage.as_str(), kind_of(&other));
                return Disposition::DeadLetter { reason, messages: vec![] };
            }
        };
        let (session, turn) = (&key.session_id, key.turn_id.as_str());
        match result {
            Ok(disposition) => disposition,
            Err(StageError::Transient(reason)) => {
                warn!(stage = self.stage.as_str(), %session, turn, %reason, "transient failure");
                Disposition::Retry { reason }
            }
            Err(StageError::Permanent(reason)) => {
                warn!(stage = self.stage.as_str(), %session, turn, %reason, "permanent failure, failing the turn");
                let error = ApiError::new(
                    ErrorCode::Internal,
                    format!(
                        "the {} stage could not use this turn's data; an operator has the details",
                        self.stage.as_str()
                    ),
                );
                let messages = self.fail_turn(&d, error);
                Disposition::DeadLetter { reason, messages }
            }
            Err(StageError::Refused(reason)) => Disposition::DeadLetter { reason, messages: vec![] },
        }
    }

    fn next(&self, result: Result<(StageName, StageMessage), StageError>) -> Result<Disposition, StageError> {
        result.map(|(next, msg)| Disposition::forward(vec![self.deps.to_stage(next, &msg)]))
    }

    /// The turn of a stage message that is given up (retries spent, poison, undeliverable)
    /// ends with an error reply.
    fn give_up(&self, delivery: &Delivery, reason: &str) -> Vec<OutMessage> {
        let code = if reason.starts_with(crate::broker::UNDELIVERABLE) {
            ErrorCode::Undeliverable
        } else if self.stage == StageName::Invoke {
            ErrorCode::LlmUnavailable
        } else {
            ErrorCode::RetriesExhausted
        };
        let error = ApiError::new(code, format!("the {} stage gave up: {reason}", self.stage.as_str()));
        self.fail_turn(delivery, error)
    }

    /// The messages that end a stage message's turn with `error`: a failed persist job, or
    /// nothing if a failed persist job is what cannot be handled.
    fn fail_turn(&self, delivery: &Delivery, error: ApiError) -> Vec<OutMessage> {
        let Ok(msg) = serde_json::from_slice::<StageMessage>(&delivery.body) else { return vec![] };
        match msg {
            // A failure that could not even be recorded is an operator's to look at.
            StageMessage::Persist(p)
                if matches!(p.result, RoundTrip::Failed { .. }) && p.assembled.is_none() =>
            {
                let (session, turn) = (&p.job.key.session_id, &p.job.key.turn_id);
                tracing::error!(%session, %turn, error = %error.message, "could not record a failed turn");
                vec![]
            }
            // Persist must not give up silently: failing again means telling the client.
            StageMessage::Persist(mut p) => {
                p.result = RoundTrip::Failed { errors: vec![error], raw: None };
                p.assembled = None;
                vec![self.deps.to_stage(StageName::Persist, &StageMessage::Persist(p))]
            }
            other => {
                let job = other.job().clone();
                vec![self.deps.to_stage(StageName::Persist, &failed(job, vec![error]))]
            }
        }
    }
}

fn kind_of(m: &StageMessage) -> &'static str {
    match m {
        StageMessage::Retrieve(_) => "retrieve",
        StageMessage::Assemble(_) => "assemble",
        StageMessage::Invoke(_) => "invoke",
        StageMessage::Persist(_) => "persist",
    }
}

impl Handler for StageHandler {
    fn handle(&self, delivery: Delivery) -> BoxFuture<'_, Disposition> {
        Box::pin(self.handle_typed(delivery))
    }

    fn exhausted(&self, delivery: Delivery, reason: String) -> BoxFuture<'_, Vec<OutMessage>> {
        Box::pin(async move {
            if self.stage == StageName::Validate {
                return validate::exhausted(
                    &self.deps,
                    &delivery.body,
                    delivery.message_id.as_deref(),
                    &reason,
                )
                .await;
            }
            self.give_up(&delivery, &reason)
        })
    }

    fn ordering_key(&self, delivery: &Delivery) -> Option<String> {
        // Turns of one session are admitted in arrival order; other stages need no order
        // because admission lets only one turn per session run at a time.
        (self.stage == StageName::Validate)
            .then(|| crate::validate::session_hint(&delivery.body).map(|s| s.to_string()))
            .flatten()
    }

    fn count_redelivery(&self, delivery: &Delivery) -> BoxFuture<'_, Result<Option<u32>, String>> {
        let key = validate::message_fingerprint(delivery.message_id.as_deref(), &delivery.body);
        Box::pin(async move {
            match self.deps.store.count_redelivery(&key).await {
                Ok(count) => Ok(Some(count)),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn published(&self, outbox_ids: Vec<i64>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(error) = self.deps.store.delete_outbox(&outbox_ids).await {
                // The rows stay; a redelivery would publish them again (consumers dedupe by id).
                warn!(%error, "could not delete published outbox rows");
            }
        })
    }
}
