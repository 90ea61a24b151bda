//! Persist: how a round trip ended in; the immutable record, the session's new state, the
//! turn's transition and the reply, committed together, out (through the outbox).

use serde_json::{json, Value};

use super::{user_turn, Deps, StageError};
use crate::assemble::{AnswerOutcome, Assembled, ProviderAnswer, SessionState};
use crate::contracts::{AgentExecuteResponse, InvokeResult, Outcome, Reply, UserTurn, UserWarning};
use crate::messages::{PersistJob, RoundTrip, TurnJob};
use crate::store::{FinishStep, NewRecord, PendingOutbox, StepOutcome, TurnRow};

/// Runs the stage for one round trip.
pub async fn run(deps: &Deps, job: PersistJob) -> Result<PendingOutbox, StageError> {
    let key = job.job.key.clone();
    let step = job.job.step;
    let (reply, step_outcome, session_state, provider_id, usage, raw, errors) = match job.result.clone() {
        RoundTrip::Answered(a) => {
            let outcome = with_warnings(a.outcome, &job);
            let state = new_state(deps, &job, &a.response_id, a.created_at, &outcome).await?;
            let step_outcome = match &outcome {
                Outcome::Final(_) => StepOutcome::Completed,
                Outcome::ClientToolContinuation(c) => StepOutcome::AwaitingToolResults {
                    pending: serde_json::to_value(c.tool_calls()).unwrap_or_default(),
                    warnings: serde_json::to_value(owed_warnings(&job)).unwrap_or_default(),
                },
            };
            let reply: Reply = InvokeResult::ok(AgentExecuteResponse {
                session_id: key.session_id,
                turn_id: key.turn_id.clone(),
                mode_display_name: mode_display_name(deps, &job.job),
                outcome,
            });
            let usage = a.usage.map(|u| serde_json::to_value(u).unwrap_or_default());
            (reply, step_outcome, state, Some(a.response_id), usage, Some(a.raw), json!([]))
        }
        RoundTrip::Failed { errors, raw } => {
            let errors_json = serde_json::to_value(&errors).unwrap_or_default();
            (InvokeResult::fail(errors), StepOutcome::Failed, None, None, None, raw, errors_json)
        }
    };
    let reply_json = serde_json::to_value(&reply).unwrap_or_default();
    let record = record(&job, provider_id, raw, usage, errors, reply_json);
    let messages =
        vec![deps.reply(&key.session_id, Some(key.turn_id.as_str()), &format!("step-{step}"), &reply)];
    let finish = FinishStep { key, step, record, session_state, outcome: step_outcome, messages };
    let next = |row: &TurnRow| super::validate::forward(deps, row);
    Ok(deps.store.finish_step(finish, &next).await?)
}

/// Warnings of this round trip and the turn's earlier ones (AGN-033: warnings are final-only,
/// so a tool continuation carries them forward to the turn's final response).
fn owed_warnings(job: &PersistJob) -> Vec<UserWarning> {
    let assembled = job.assembled.iter().flat_map(|a| a.record.user_warnings.iter());
    job.warnings.iter().chain(assembled).cloned().collect()
}

/// Adds retrieval and assembly warnings to a final answer (AGN-033: warnings are final-only).
fn with_warnings(outcome: Outcome, job: &PersistJob) -> Outcome {
    with_owed_warnings(outcome, &owed_warnings(job))
}

/// A final answer with the warnings the turn owes (`owed`) before the provider's own; a tool
/// continuation unchanged. Shared with reprocessing, which must shape answers the same way.
pub(crate) fn with_owed_warnings(outcome: Outcome, owed: &[UserWarning]) -> Outcome {
    match outcome {
        Outcome::Final(mut f) => {
            let mut warnings = owed.to_vec();
            warnings.append(&mut f.user_warnings);
            f.user_warnings = warnings;
            Outcome::Final(f)
        }
        other => other,
    }
}

async fn new_state(
    deps: &Deps,
    job: &PersistJob,
    response_id: &str,
    created_at: chrono::DateTime<chrono::Utc>,
    outcome: &Outcome,
) -> Result<Option<Value>, StageError> {
    let Some(assembled) = &job.assembled else { return Ok(None) };
    let raw = deps.store.session_state(&job.job.key.session_id).await?;
    // Corrupt state must not silently become an empty one: the turn fails instead.
    let state: SessionState = serde_json::from_value(raw)?;
    let outcome = match outcome {
        Outcome::Final(f) => AnswerOutcome::Final { output_text: f.primary_output_text.clone() },
        Outcome::ClientToolContinuation(c) => AnswerOutcome::ToolCalls { calls: c.tool_calls().to_vec() },
    };
    let answer = ProviderAnswer { response_id: response_id.to_owned(), created_at, outcome };
    let next = state.apply_answer(&assembled.update, &answer, &deps.settings.assemble);
    Ok(Some(serde_json::to_value(next)?))
}

fn mode_display_name(deps: &Deps, job: &TurnJob) -> String {
    user_turn(job)
        .and_then(|t| deps.conversation_context(t).ok())
        .map_or_else(String::new, |c| c.mode_display_name.clone())
}

fn record(
    job: &PersistJob,
    provider_response_id: Option<String>,
    response_payload: Option<Value>,
    usage: Option<Value>,
    errors: Value,
    reply: Value,
) -> NewRecord {
    let mut record =
        base_record(user_turn(&job.job), job.assembled.as_ref(), &record_kind(&job.result), reply);
    record.provider_response_id = provider_response_id;
    record.response_payload = response_payload;
    record.usage = usage;
    record.errors = errors;
    record
}

/// A record's fields that come from the turn and what was sent; the outcome's fields empty.
/// Shared with reprocessing, whose records must read like the pipeline's.
pub(crate) fn base_record(
    turn: Option<&UserTurn>,
    assembled: Option<&Assembled>,
    kind: &str,
    reply: Value,
) -> NewRecord {
    let sent = assembled.map(|a| &a.record);
    let to = |v: Option<Value>| v.unwrap_or_else(|| json!([]));
    NewRecord {
        kind: kind.to_owned(),
        provider_response_id: None,
        chain: sent.map(|r| serde_json::to_value(&r.chain).unwrap_or_default()).unwrap_or_else(|| json!({})),
        request_payload: assembled.map(|a| a.body.clone()),
        response_payload: None,
        retrieved_chunks: to(sent.and_then(|r| serde_json::to_value(&r.chunks).ok())),
        active_files: to(sent.and_then(|r| serde_json::to_value(&r.files).ok())),
        skipped_files: to(sent.and_then(|r| serde_json::to_value(&r.skipped_files).ok())),
        usage: None,
        errors: json!([]),
        instruction: turn.and_then(|t| t.instruction().map(str::to_owned)),
        workspace_id: turn.and_then(|t| t.workspace_id().map(str::to_owned)),
        repo: turn.and_then(|t| t.repo().map(str::to_owned)),
        language: turn.and_then(|t| t.language().map(str::to_owned)),
        rag_scope: turn
            .map_or_else(|| json!([]), |t| serde_json::to_value(t.rag_scope()).unwrap_or_default()),
        reply,
    }
}

fn record_kind(result: &RoundTrip) -> String {
    match result {
        RoundTrip::Answered(a) => match a.outcome {
            Outcome::Final(_) => "final",
            Outcome::ClientToolContinuation(_) => "client_tool_continuation",
        },
        RoundTrip::Failed { .. } => "error",
    }
    .to_owned()
}
