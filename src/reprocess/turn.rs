//! Running one stored turn again: its round trips in order, each assembled from the rebuilt
//! inputs, sent through the [`LlmClient`] to the turn's configured endpoint and recorded. The
//! session state of the run is private to the turn; nothing is written until the whole turn is
//! done, so an interrupted turn is simply run again.

use chrono::Utc;
use tracing::debug;

use super::rebuild::{continuation_request, provider_answer, user_request, TurnInputs};
use super::record::{answered, failed, step_warnings};
use super::why::Unreplayable;
use crate::assemble::AssemblePolicy;
use crate::config::{ConversationContext, Settings};
use crate::contracts::{Outcome, ToolCall, UserTurn};
use crate::llm::{Endpoint, LlmClient, LlmError, LlmRequest};
use crate::store::LinkedRecord;

/// How a turn is run: the client, where it calls, and with which context.
#[derive(Debug)]
pub(crate) struct Replayer<'a> {
    /// The LLM client.
    pub llm: &'a dyn LlmClient,
    /// The endpoint of the turn's AgentContext.
    pub endpoint: Endpoint,
    /// The ConversationContext, overrides applied.
    pub context: ConversationContext,
    /// The delta policy.
    pub policy: &'a AssemblePolicy,
    /// The versions of the contexts it replays with, overrides applied (`context_versions`).
    pub versions: serde_json::Value,
}

/// The endpoint serving a turn, as the invoke stage resolves it.
pub(crate) fn endpoint_for(settings: &Settings, turn: &UserTurn) -> Result<Endpoint, Unreplayable> {
    let agent = settings.agent_context(turn.agent_context_id()).ok_or_else(|| {
        let id = turn.agent_context_id().map_or("(default)", |c| c.as_str());
        Unreplayable::UnknownAgentContext(id.to_owned())
    })?;
    Ok(Endpoint::resolve(&settings.llm, Some(agent))?)
}

/// Whether an LLM error is the model's answer to this request (recorded, like the pipeline does)
/// rather than a failure to get one (the turn is left for a later run).
fn is_model_outcome(e: &LlmError) -> bool {
    matches!(e, LlmError::Refused { .. } | LlmError::Failed { .. } | LlmError::InvalidResponse(_))
}

impl Replayer<'_> {
    /// Runs the turn; the records to write, or why the turn failed.
    pub(crate) async fn replay(
        &self,
        inputs: &TurnInputs,
    ) -> Result<Vec<LinkedRecord>, Unreplayable> {
        let mut state = inputs.state.clone();
        let mut records = Vec::new();
        let mut calls: Option<Vec<ToolCall>> = None;
        // Warnings of the turn's round trips so far, owed to its final response.
        let mut owed = Vec::new();
        for (i, step) in inputs.steps.iter().enumerate() {
            let assembled = if i == 0 {
                user_request(inputs, &self.context, self.policy, Utc::now())?
            } else {
                // A later round trip answers tool calls: only when the new run asked for them too.
                let (Some(asked), Some(job)) = (calls.take(), step.job.as_ref()) else { break };
                match continuation_request(
                    &state,
                    job,
                    &asked,
                    &self.context,
                    self.policy,
                    Utc::now(),
                ) {
                    Ok(a) => a,
                    Err(reason) => {
                        debug!(turn = %inputs.turn.key().turn_id, step = step.original.step, %reason, "round trip not replayed");
                        break;
                    }
                }
            };
            let request = LlmRequest {
                endpoint: &self.endpoint,
                body: &assembled.body,
                deltas: None,
                once: false,
            };
            let started = std::time::Instant::now();
            let result = self.llm.create_response(request).await;
            // The call's duration, for `aptix eval`'s latency scorer.
            let timings = serde_json::json!({ "llm_ms": started.elapsed().as_millis() as u64 });
            match result {
                Ok(response) => {
                    let answer = crate::messages::Answer::from(response);
                    state = state.apply_answer(
                        &assembled.update,
                        &provider_answer(&answer),
                        self.policy,
                    );
                    if let Outcome::ClientToolContinuation(c) = &answer.outcome {
                        calls = Some(c.tool_calls().to_vec());
                    }
                    owed.extend(step_warnings(step, &assembled));
                    let mut record =
                        answered(inputs, step, &assembled, &answer, &self.context, &owed)?;
                    record.record.context_versions = Some(self.versions.clone());
                    record.record.stage_timings = Some(timings);
                    records.push(record);
                }
                Err(e) if is_model_outcome(&e) => {
                    let mut record = failed(inputs, step, &assembled, &e)?;
                    record.record.context_versions = Some(self.versions.clone());
                    record.record.stage_timings = Some(timings);
                    records.push(record);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(records)
    }
}
