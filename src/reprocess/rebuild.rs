//! Rebuilding a stored turn's requests from what the pipeline kept, without touching the live
//! session:
//!
//! - The turn, its retrieved chunks (with text) and its retrieval warnings come from the invoke
//!   stage's saved round trip (`llm_results`, a `EndedRoundTrip`): the validated request, and the
//!   assembled `StateUpdate`, which holds the text of every chunk the turn sent. Chunks the
//!   turn's chain already held were not resent; their text is taken from the session history.
//! - The session as it was just before the turn is replayed from the same saved round trips of
//!   the session's earlier steps, with the pipeline's own `SessionState::apply_answer`. Its
//!   provider chain is then dropped, so the request is self-contained: a new chain rehydrated
//!   with the earlier turns, chunks and files (what the pipeline sends when the provider has
//!   lost a chain), never a `previous_response_id` into the original conversation.
//! - `assemble` builds the body from those inputs with the chosen ConversationContext (the
//!   turn's own or `--conversation-context`, with `--model` applied), `stream: false`.
//! - A tool round trip is replayed with the tool results the client sent originally, on the new
//!   chain, when the new answer asks for the same tools in the same order; their call ids are
//!   mapped to the new ones. Otherwise the turn ends there (its outputs differ).

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::history::Histories;
use super::why::Unreplayable;
use crate::assemble::{
    assemble, AnswerOutcome, AssembleInput, AssemblePolicy, Assembled, ProviderAnswer,
    SessionState, TurnInput,
};
use crate::chunk::Chunk;
use crate::config::{ConversationContext, Settings};
use crate::contracts::{
    Outcome, ToolCall, ToolContinuation, ToolResult, UserTurn, ValidatedRequest,
};
use crate::messages::{Answer, EndedRoundTrip, RoundTrip, SavedRoundTrip};
use crate::store::{OriginalStep, Store, StoreError};

/// One original record of the turn and its saved round trip, if there is one.
#[derive(Debug, Clone)]
pub(crate) struct StepInput {
    /// The original record.
    pub original: OriginalStep,
    /// The saved round trip; `None` when the step never reached the model.
    pub job: Option<EndedRoundTrip>,
    /// Why a saved round trip could not be read, if it could not.
    pub unreadable: Option<String>,
}

/// Everything needed to run a turn again.
#[derive(Debug, Clone)]
pub(crate) struct TurnInputs {
    /// Session.
    pub session: Uuid,
    /// The user turn.
    pub turn: UserTurn,
    /// Its original records, by step.
    pub steps: Vec<StepInput>,
    /// The chunks retrieved for the turn, with text.
    pub chunks: Vec<Chunk>,
    /// The session before the turn, without a provider chain.
    pub state: SessionState,
}

/// A turn's original records, read once; [`load`] completes them into [`TurnInputs`].
pub(crate) async fn originals(
    store: &Store,
    session: Uuid,
    turn: &str,
) -> Result<Vec<StepInput>, StoreError> {
    let steps = store.original_steps(session, turn).await?;
    Ok(steps
        .into_iter()
        .map(|original| {
            let parsed = original.saved.clone().map(SavedRoundTrip::read).transpose();
            match parsed {
                Ok(job) => StepInput { original, job, unreadable: None },
                Err(e) => StepInput { original, job: None, unreadable: Some(e.to_string()) },
            }
        })
        .collect())
}

/// The inputs of a turn, or why it cannot be run again. The session before it is replayed
/// from the latest state `histories` keeps for it, and kept there in turn.
pub(crate) async fn load(
    store: &Store,
    policy: &AssemblePolicy,
    histories: &Histories,
    session: Uuid,
    steps: Vec<StepInput>,
) -> Result<Result<TurnInputs, Unreplayable>, StoreError> {
    let Some(first) = steps.first().filter(|s| s.original.step == 0) else {
        return Ok(Err(Unreplayable::NoFirstStep));
    };
    if let Some(e) = &first.unreadable {
        return Ok(Err(Unreplayable::Unreadable(e.clone())));
    }
    let Some(job) = &first.job else {
        return Ok(Err(Unreplayable::NeverCalled));
    };
    let (ValidatedRequest::UserTurn(turn), Some(assembled)) = (&job.admitted.turn, &job.assembled)
    else {
        return Ok(Err(Unreplayable::NoUserTurn));
    };
    let seq = first.original.seq;
    let (from, start) =
        histories.before(session, seq).unwrap_or((i64::MIN, SessionState::default()));
    let mut state = start;
    let mut after = None;
    loop {
        let page = store.saved_steps_page(session, (from, seq), after, SAVED_PAGE).await?;
        let full = page.len() as i64 == SAVED_PAGE;
        after = page.last().map(|(place, _)| *place);
        let saved: Vec<Value> = page.into_iter().map(|(_, saved)| saved).collect();
        state = replay_state(state, &saved, policy);
        if !full {
            break;
        }
    }
    histories.keep(session, seq, &state);
    let chunks = assembled.retrieved_chunks(&state);
    state.chain = None;
    state.chain_reset = None;
    state.open_turn = None;
    Ok(Ok(TurnInputs { session, turn: turn.clone(), chunks, state, steps }))
}

/// Saved round trips read at a time while a session's history is rebuilt.
pub(crate) const SAVED_PAGE: i64 = 16;

/// The session state the pipeline had after `state` and then the saved round trips `saved`,
/// in order.
pub(crate) fn replay_state(
    mut state: SessionState,
    saved: &[Value],
    policy: &AssemblePolicy,
) -> SessionState {
    for value in saved {
        let job = match SavedRoundTrip::read(value.clone()) {
            Ok(job) => job,
            Err(error) => {
                // The rebuilt history lacks this round trip; the rest of it still counts.
                tracing::warn!(%error, "unreadable saved round trip left out of the replayed history");
                continue;
            }
        };
        if let (Some(assembled), RoundTrip::Answered(answer)) = (&job.assembled, &job.result) {
            state = state.apply_answer(&assembled.update, &provider_answer(answer), policy);
        }
    }
    state
}

/// What the session state needs to know of an answer.
pub(crate) fn provider_answer(answer: &Answer) -> ProviderAnswer {
    let outcome = match &answer.outcome {
        Outcome::Final(f) => AnswerOutcome::Final { output_text: f.primary_output_text.clone() },
        Outcome::ClientToolContinuation(c) => {
            AnswerOutcome::ToolCalls { calls: c.tool_calls().to_vec() }
        }
        Outcome::ToolApprovalRequired(a) => {
            AnswerOutcome::ToolCalls { calls: a.tool_calls().to_vec() }
        }
    };
    ProviderAnswer {
        response_id: answer.response_id.clone(),
        created_at: answer.created_at,
        outcome,
    }
}

/// The ConversationContext a turn runs with: `--conversation-context` or the turn's own, with
/// `--model` applied.
pub(crate) fn context_for(
    settings: &Settings,
    turn: &UserTurn,
    override_id: Option<&str>,
    model: Option<&str>,
) -> Result<ConversationContext, Unreplayable> {
    let found = match override_id {
        Some(id) => settings.conversation_contexts.get(id),
        None => settings.conversation_context(turn.conversation_context_id()),
    };
    let mut context = found.cloned().ok_or_else(|| {
        let id = override_id.or(turn.conversation_context_id().map(|c| c.as_str()));
        Unreplayable::UnknownConversationContext(id.unwrap_or("(default)").to_owned())
    })?;
    if let Some(model) = model {
        model.clone_into(&mut context.model);
    }
    Ok(context)
}

/// The first request of the turn.
pub(crate) fn user_request(
    inputs: &TurnInputs,
    context: &ConversationContext,
    policy: &AssemblePolicy,
    now: DateTime<Utc>,
) -> Result<Assembled, Unreplayable> {
    let turn = TurnInput::User { turn: &inputs.turn, chunks: &inputs.chunks };
    // MCP tools are not listed again for a replay: it offers the built-ins and client tools.
    let state = &inputs.state;
    let assembled = assemble(AssembleInput { state, context, policy, now, turn, mcp_tools: &[] })?;
    Ok(never_streaming(assembled))
}

/// The request answering the new run's tool `calls` with the results the client originally
/// sent for step `original`, or why the step cannot be replayed.
pub(crate) fn continuation_request(
    state: &SessionState,
    original: &EndedRoundTrip,
    calls: &[ToolCall],
    context: &ConversationContext,
    policy: &AssemblePolicy,
    now: DateTime<Utc>,
) -> Result<Assembled, Unreplayable> {
    let Some(ValidatedRequest::ToolContinuation(sent)) = &original.admitted.continuation else {
        return Err(Unreplayable::NoToolResults);
    };
    let asked = &original.admitted.pending_tool_calls;
    let names = |c: &[ToolCall]| c.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    if names(asked) != names(calls) {
        return Err(Unreplayable::OtherCalls {
            new: names(calls).join(", "),
            original: names(asked).join(", "),
        });
    }
    let results: Vec<ToolResult> = sent
        .results()
        .iter()
        .filter_map(|r| {
            let i = asked.iter().position(|c| c.tool_call_id == r.tool_call_id)?;
            Some(ToolResult { tool_call_id: calls[i].tool_call_id.clone(), ..r.clone() })
        })
        .collect();
    let continuation = ToolContinuation { key: sent.key().clone(), results, approvals: Vec::new() };
    let turn = TurnInput::ToolContinuation {
        continuation: &continuation,
        pending: calls,
        stream: false,
        // The follow-ups the original call took in, as it carried them.
        steers: &original.admitted.steers,
    };
    let assembled = assemble(AssembleInput { state, context, policy, now, turn, mcp_tools: &[] })?;
    Ok(never_streaming(assembled))
}

/// `assembled` with `"stream": false`: a replay never streams. Only reprocessing edits a built
/// body, so only it pays for the tree.
fn never_streaming(mut assembled: Assembled) -> Assembled {
    let mut body = assembled.body.to_value();
    body["stream"] = Value::Bool(false);
    assembled.body = body.into();
    assembled
}
