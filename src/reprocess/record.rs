//! The record of one reprocessed round trip, shaped like the persist stage's: what was sent,
//! the provider's answer and the reply the client would have got (never published). It is
//! linked to the original record it reprocesses.

use super::rebuild::{StepInput, TurnInputs};
use crate::assemble::Assembled;
use crate::config::ConversationContext;
use crate::contracts::{AgentExecuteResponse, ApiError, InvokeResult, Outcome, Reply, UserWarning};
use crate::llm::LlmError;
use crate::messages::with_owed_warnings;
use crate::messages::Answer;
use crate::store::{LinkedRecord, NewRecord};

/// The warnings a round trip owes the turn's final response: the original retrieval warnings of
/// the step and the new assembly's.
pub(crate) fn step_warnings(step: &StepInput, assembled: &Assembled) -> Vec<UserWarning> {
    let retrieval = step.job.iter().flat_map(|j| j.warnings.iter());
    retrieval.chain(assembled.record.user_warnings.iter()).cloned().collect()
}

/// The record of an answered round trip; a final answer carries `owed` (the warnings of this
/// and earlier round trips of the turn) before the provider's own, as the persist stage does.
pub(crate) fn answered(
    inputs: &TurnInputs,
    step: &StepInput,
    assembled: &Assembled,
    answer: &Answer,
    context: &ConversationContext,
    owed: &[UserWarning],
) -> Result<LinkedRecord, serde_json::Error> {
    let outcome = with_owed_warnings(answer.outcome.clone(), owed);
    let kind = match outcome {
        Outcome::Final(_) => "final",
        Outcome::ClientToolContinuation(_) => "client_tool_continuation",
        Outcome::ToolApprovalRequired(_) => "tool_approval_required",
    };
    let key = inputs.turn.key();
    let reply: Reply = InvokeResult::ok(AgentExecuteResponse {
        session_id: key.session_id,
        turn_id: key.turn_id.clone(),
        mode_display_name: context.mode_display_name.clone(),
        outcome,
    })
    .about(key.session_id, Some(key.turn_id.clone()));
    let mut record = base(inputs, assembled, kind, reply)?;
    record.provider_response_id = Some(answer.response_id.clone());
    record.response_payload = Some(answer.raw.clone());
    record.usage = answer.usage.map(serde_json::to_value).transpose()?;
    Ok(link(inputs, step, record))
}

/// The record of a round trip the model did not answer usefully (refused, failed, unreadable).
pub(crate) fn failed(
    inputs: &TurnInputs,
    step: &StepInput,
    assembled: &Assembled,
    error: &LlmError,
) -> Result<LinkedRecord, serde_json::Error> {
    let errors = vec![ApiError::new(error.code(), error.to_string())];
    let key = inputs.turn.key();
    let reply: Reply =
        InvokeResult::fail(errors.clone()).about(key.session_id, Some(key.turn_id.clone()));
    let mut record = base(inputs, assembled, "error", reply)?;
    record.errors = serde_json::to_value(&errors)?;
    record.response_payload = error.raw_response().cloned();
    Ok(link(inputs, step, record))
}

fn base(
    inputs: &TurnInputs,
    assembled: &Assembled,
    kind: &str,
    reply: Reply,
) -> Result<NewRecord, serde_json::Error> {
    NewRecord::base(Some(&inputs.turn), Some(assembled), kind, serde_json::to_value(&reply)?)
}

fn link(inputs: &TurnInputs, step: &StepInput, record: NewRecord) -> LinkedRecord {
    LinkedRecord {
        reprocess_of: step.original.id,
        session_id: inputs.session,
        turn_id: inputs.turn.key().turn_id.to_string(),
        step: step.original.step,
        record,
    }
}
