//! Persist: how a round trip ended in; the immutable record, the session's new state, the
//! turn's transition and the reply, committed together, out (through the outbox).

use std::sync::Arc;

use serde_json::{json, Value};

use super::Deps;
use crate::assemble::{AnswerOutcome, PackedState, ProviderAnswer, SessionState};
use crate::config::{ContextVersions, Settings};
use crate::contracts::{
    AgentExecuteResponse, ApiError, ErrorCode, InvokeResult, Outcome, Reply, ToolApprovalOutput,
    UserWarning,
};
use crate::messages::hops;
use crate::messages::{with_owed_warnings, Answer, Done, EndedRoundTrip, ReplyOut, RoundTrip};
use crate::stage::{Output, Stage, StageError};
use crate::store::{
    cancelled, FinishStep, Finished, NewRecord, Settle, StateToUpdate, StepOutcome, Store,
};

/// Writes the immutable record and publishes the reply.
#[derive(Debug)]
pub struct Persist {
    settings: Arc<Settings>,
    store: Store,
    /// Every configured context's version, for the records.
    versions: ContextVersions,
}

impl Persist {
    /// The stage, using `deps`' store and settings.
    pub fn new(deps: &Deps) -> Self {
        let versions = ContextVersions::of(&deps.settings);
        Persist { settings: deps.settings.clone(), store: deps.store.clone(), versions }
    }
}

mod calls;

use calls::{route, unanswerable, Routed};

/// What a round trip's end writes, before the record.
struct Ending {
    /// What the client receives; none when the turn runs on with server tools.
    reply: Option<Reply>,
    /// The record's kind.
    kind: &'static str,
    outcome: StepOutcome,
    session_state: Option<PackedState>,
    provider_id: Option<String>,
    usage: Option<Value>,
    raw: Option<Value>,
    errors: Value,
}

impl Stage for Persist {
    const NAME: &'static str = "persist";
    type In = EndedRoundTrip;
    type Out = Done;

    async fn run(&self, job: EndedRoundTrip) -> Result<Output<Done>, StageError> {
        let pending = match self.finish(&job).await? {
            Finished::Done(pending) => pending,
            // The client's cancel came while the round trip ran: it ends as cancelled instead.
            Finished::CancelRequested => match self.finish(&job.into_cancelled()).await? {
                Finished::Done(pending) => pending,
                Finished::CancelRequested => {
                    return Err(StageError::unusable("a cancelled ending was refused"))
                }
            },
        };
        Ok(Output::Committed(pending))
    }
}

impl Persist {
    /// Writes the record (with the round trip's path), the session's state, the turn's
    /// transition and the reply.
    async fn finish(&self, job: &EndedRoundTrip) -> Result<Finished, StageError> {
        let (key, step) = (job.admitted.key.clone(), job.admitted.step);
        let mut e = self.ending(job).await?;
        // Every ending's body names its turn, a failure's too (issue 41).
        e.reply = e.reply.map(|r| r.about(key.session_id, Some(key.turn_id.clone())));
        let out = match &e.reply {
            Some(reply) => Some(
                ReplyOut::step(key.session_id, key.turn_id.as_str(), step, reply)?
                    .to(job.admitted.address()),
            ),
            None => None,
        };
        let sent = match (&out, &e.outcome) {
            (Some(out), _) => out.body.clone(),
            (None, StepOutcome::ServerTools { server_calls, .. }) => {
                json!({ "ServerToolCalls": server_calls })
            }
            (None, _) => json!({}),
        };
        let mut record =
            NewRecord::base(job.admitted.user_turn().ok(), job.assembled.as_ref(), e.kind, sent)?;
        record.provider_response_id = e.provider_id;
        record.response_payload = e.raw;
        record.usage = e.usage;
        record.errors = e.errors;
        record.stage_timings = Some(path(job));
        record.context_versions = job
            .admitted
            .user_turn()
            .ok()
            .map(|t| self.versions.record(t.conversation_context_id(), t.agent_context_id()));
        let finish = FinishStep {
            key,
            step,
            record,
            session_state: e.session_state,
            outcome: e.outcome,
            reply: out,
            cancelled: matches!(job.result, RoundTrip::Cancelled { .. }),
            steers: job.assembled.as_ref().map(|a| a.record.steered_by.clone()).unwrap_or_default(),
            settle: self.settings.budgets_configured().then(|| settle(&self.settings, job)),
            tenant: job.admitted.tenant.clone(),
        };
        Ok(self.store.finish_step(finish).await?)
    }

    async fn ending(&self, job: &EndedRoundTrip) -> Result<Ending, StageError> {
        match &job.result {
            RoundTrip::Answered(a) => self.answered(job, a).await,
            RoundTrip::Failed { errors, raw } => {
                let mut e = failed(errors.clone(), raw.clone(), "error")?;
                // A refusal or a failed response the provider answered was billed: its usage
                // counts against the tenant's tokens as an answer's does, or a tenant whose
                // every call is refused would spend without limit (docs/tenancy.md §7).
                let usage =
                    raw.as_ref().and_then(|r| r.get("usage")).and_then(crate::llm::map_usage);
                e.usage = usage.as_ref().map(serde_json::to_value).transpose()?;
                Ok(e)
            }
            RoundTrip::Cancelled { streamed, answered, estimate } => {
                let raw = json!({ "cancelled": true, "streamed_text": streamed,
                                  "answer": answered.as_ref().map(|a| &a.raw),
                                  "usage_estimated": answered.is_none() && estimate.is_some() });
                let mut e = failed(vec![cancelled("while it ran")], Some(raw), "cancelled")?;
                if let Some(a) = answered {
                    e.provider_id = Some(a.response_id.clone());
                    e.usage = a.usage.as_ref().map(serde_json::to_value).transpose()?;
                } else if let Some(estimate) = estimate {
                    // An aborted call spent tokens no answer reported: charged by estimate.
                    e.usage = Some(serde_json::to_value(estimate)?);
                }
                Ok(e)
            }
        }
    }

    /// A provider's answer: final, calls for the client, or server tools to run first.
    async fn answered(&self, job: &EndedRoundTrip, a: &Answer) -> Result<Ending, StageError> {
        let key = &job.admitted.key;
        let owed = owed_warnings(job);
        let outcome = with_owed_warnings(a.outcome.clone(), &owed);
        // The chain holds every call of the answer, the server's too.
        let session_state = self.new_state(job, &a.response_id, a.created_at, &outcome).await?;
        let turn = job.admitted.user_turn().map_err(StageError::fail)?;
        let tools = super::conversation_context(&self.settings, turn)
            .map(|c| c.server_tools.clone())
            .unwrap_or_default();
        let executed = serde_json::to_value(&job.admitted.executed)?;
        let give_up = |error: ApiError| -> Result<Ending, StageError> {
            let mut e = failed(vec![error], Some(a.raw.clone()), "error")?;
            e.provider_id = Some(a.response_id.clone());
            e.usage = a.usage.as_ref().map(serde_json::to_value).transpose()?;
            Ok(e)
        };
        let routed = route(outcome, &tools, &job.admitted.executed);
        let max = self.settings.limits.max_tool_results;
        if let Some(calls) = unanswerable(&routed, max) {
            // The client could never send that many results or decisions back: the turn would
            // wait on it for good.
            return give_up(ApiError::new(
                ErrorCode::LlmInvalidResponse,
                format!(
                    "the model asked the client about {calls} tool calls in one answer; a client can answer at most {max} (limits.max_tool_results)"
                ),
            ));
        }
        let (outcome, step_outcome, kind) = match routed {
            Routed::Final(o) => (Some(o), StepOutcome::Completed, "final"),
            Routed::Client { outcome, server } => {
                let Outcome::ClientToolContinuation(c) = &outcome else {
                    return Err(StageError::unusable("a client route without calls"));
                };
                let waits = StepOutcome::AwaitingToolResults {
                    pending: serde_json::to_value(c.tool_calls())?,
                    warnings: serde_json::to_value(&owed)?,
                    server_calls: serde_json::to_value(server)?,
                    executed,
                };
                (Some(outcome), waits, "client_tool_continuation")
            }
            Routed::Approval { gated, server, message } => {
                let expires_at = tools.approval_expires_at();
                let out = ToolApprovalOutput::new(gated, expires_at, message)
                    .ok_or_else(|| StageError::unusable("an approval without calls"))?;
                let waits = StepOutcome::AwaitingApproval {
                    pending: serde_json::to_value(out.tool_calls())?,
                    warnings: serde_json::to_value(&owed)?,
                    server_calls: serde_json::to_value(server)?,
                    executed,
                    expires_at,
                };
                (Some(Outcome::ToolApprovalRequired(out)), waits, "tool_approval_required")
            }
            Routed::Server(server) => {
                let server_calls = serde_json::to_value(server)?;
                let warnings = serde_json::to_value(&owed)?;
                (
                    None,
                    StepOutcome::ServerTools { server_calls, executed, warnings },
                    "server_tool_calls",
                )
            }
            Routed::NotAnAnswer => {
                return Err(StageError::unusable("an approval request as the model's answer"))
            }
            Routed::TooManyRounds(max) => {
                return give_up(ApiError::new(
                    ErrorCode::ToolsServerRoundsExceeded,
                    format!(
                        "the model called server tools in more than {max} round trips of this turn"
                    ),
                ));
            }
        };
        let reply = outcome.map(|outcome| {
            InvokeResult::ok(AgentExecuteResponse {
                session_id: key.session_id,
                turn_id: key.turn_id.clone(),
                mode_display_name: self.mode_display_name(job),
                outcome,
            })
        });
        Ok(Ending {
            reply,
            kind,
            outcome: step_outcome,
            session_state,
            provider_id: Some(a.response_id.clone()),
            usage: a.usage.as_ref().map(serde_json::to_value).transpose()?,
            raw: Some(a.raw.clone()),
            errors: json!([]),
        })
    }

    async fn new_state(
        &self,
        job: &EndedRoundTrip,
        response_id: &str,
        created_at: chrono::DateTime<chrono::Utc>,
        outcome: &Outcome,
    ) -> Result<Option<PackedState>, StageError> {
        let Some(assembled) = &job.assembled else { return Ok(None) };
        let session = &job.admitted.key.session_id;
        let carried = job.session_state.as_ref();
        let state = match self.store.session_state_to_update(session, carried).await? {
            StateToUpdate::ByRef(state) => state,
            // Corrupt state must not silently become an empty one: the turn fails instead.
            StateToUpdate::InPlace(stored) => {
                SessionState::from_stored(stored).map_err(StageError::unusable)?.into()
            }
        };
        let outcome = match outcome {
            Outcome::Final(f) => {
                AnswerOutcome::Final { output_text: f.primary_output_text.clone() }
            }
            Outcome::ClientToolContinuation(c) => {
                AnswerOutcome::ToolCalls { calls: c.tool_calls().to_vec() }
            }
            Outcome::ToolApprovalRequired(a) => {
                AnswerOutcome::ToolCalls { calls: a.tool_calls().to_vec() }
            }
        };
        let answer = ProviderAnswer { response_id: response_id.to_owned(), created_at, outcome };
        let next = state.apply_answer(&assembled.update, &answer, &self.settings.assemble);
        Ok(Some(next))
    }

    fn mode_display_name(&self, job: &EndedRoundTrip) -> String {
        job.admitted
            .user_turn()
            .ok()
            .and_then(|t| super::conversation_context(&self.settings, t).ok())
            .map_or_else(String::new, |c| c.mode_display_name.clone())
    }
}

/// The ending of a round trip that fails with `errors` (the provider's id and usage, when it
/// answered, are the caller's to add).
fn failed(
    errors: Vec<ApiError>,
    raw: Option<Value>,
    kind: &'static str,
) -> Result<Ending, StageError> {
    Ok(Ending {
        reply: Some(InvokeResult::fail(errors.clone())),
        kind,
        outcome: StepOutcome::Failed,
        session_state: None,
        provider_id: None,
        usage: None,
        raw,
        errors: serde_json::to_value(errors)?,
    })
}

/// Warnings of this round trip and the turn's earlier ones (AGN-033: warnings are final-only,
/// so a tool continuation carries them forward to the turn's final response).
fn owed_warnings(job: &EndedRoundTrip) -> Vec<UserWarning> {
    let assembled = job.assembled.iter().flat_map(|a| a.record.user_warnings.iter());
    job.warnings.iter().chain(assembled).cloned().collect()
}

/// The round trip's path as stored: its last hop is this stage's own, handed on now.
fn path(job: &EndedRoundTrip) -> Value {
    let mut path = job.hops.clone();
    if let Some(own) = path.last_mut() {
        own.sent_ms = hops::now_ms();
    }
    hops::stored(&path)
}

/// How a round trip's budget reservation settles. Only a cost that is known settles below the
/// reservation: an answer's usage, priced (a refusal's or a failed response's too, from the
/// provider's answer), and nothing for a request the provider rejected outright (a 4xx). Any
/// other ending settles at the reservation: a call aborted by a cancel before it reported usage,
/// a call given up after retries, or an attempt that made no call of its own (cancelled or
/// refused before it) while an earlier attempt's reservation is still open.
fn settle(settings: &Settings, job: &EndedRoundTrip) -> Settle {
    let model = job.assembled.as_ref().and_then(|a| a.body.head().model);
    let priced = |usage: Option<&crate::contracts::Usage>| {
        let price = model.as_deref().and_then(|m| settings.price_of(m));
        match (price, usage) {
            (Some(price), Some(usage)) => Settle::Cost(price.cost(usage)),
            _ => Settle::AtReservation,
        }
    };
    match &job.result {
        RoundTrip::Answered(a) => priced(a.usage.as_ref()),
        RoundTrip::Cancelled { answered: Some(a), .. } => priced(a.usage.as_ref()),
        RoundTrip::Cancelled { answered: None, .. } => Settle::AtReservation,
        RoundTrip::Failed { raw: Some(raw), .. } if raw.get("usage").is_some() => {
            priced(crate::llm::map_usage(&raw["usage"]).as_ref())
        }
        RoundTrip::Failed { errors, .. }
            if errors.iter().any(|e| e.code == ErrorCode::LlmRejected) =>
        {
            Settle::Cost(crate::config::Usd::ZERO)
        }
        RoundTrip::Failed { .. } => Settle::AtReservation,
    }
}
