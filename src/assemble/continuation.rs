//! Assembling a Tool Continuation Submission: `function_call_output` items, in the order of the
//! pending calls, on the chain that asked for them. When that chain is gone (expired, or the
//! provider lost it) the new chain is rehydrated, the open turn's instruction restated and the
//! calls replayed before their outputs, so the model still sees which call each output answers.
//! Follow-ups that steer the turn follow the outputs, each as a user message of its own.

use std::collections::HashSet;

use serde_json::Value;

use super::body::{envelope, prompt_cache_key, Call, ToolChoice};
use super::chain::plan_chain;
use super::message::{
    instruction_block, solution_context_text, system_message, text_part, user_message_of,
};
use super::record::{ChainStatus, SentRecord, TurnKind};
use super::rehydrate::{rehydrate, Rehydration};
use super::state::StateUpdate;
use super::tools::{call_item, check_tool_results, result_items};
use super::user_turn::sha256_hex;
use super::{AssembleError, AssembleInput, Assembled};
use crate::contracts::{Steer, ToolCall, ToolContinuation};
use crate::llm::RequestBody;

/// One round trip after the first: the results it answers the pending calls with, and the
/// follow-ups that steer it.
pub(crate) struct Round<'a> {
    pub(crate) continuation: &'a ToolContinuation,
    pub(crate) pending: &'a [ToolCall],
    pub(crate) stream: bool,
    pub(crate) steers: &'a [Steer],
}

/// Builds the request answering `pending` with `continuation`'s results.
pub(crate) fn assemble_tool_continuation(
    input: &AssembleInput<'_>,
    round: &Round<'_>,
) -> Result<Assembled, AssembleError> {
    let Round { continuation, pending, stream, steers } = *round;
    check_tool_results(pending, continuation)?;
    let (state, context, policy) = (input.state, input.context, input.policy);
    let turn_id = continuation.key().turn_id.to_string();
    let open = state.open_turn.as_ref().filter(|t| t.turn_id == turn_id);
    let mode = open.map_or(context.mode.as_str(), |t| t.mode.as_str());
    let plan = plan_chain(state, policy, input.now);
    let continuing = plan.continuing();

    let mut items: Vec<Value> = Vec::new();
    let mut rehydration = Rehydration::default();
    let mut solution_sha = None;
    if continuing.is_none() {
        items.push(system_message(&context.system_prompt));
        if plan.record().status == ChainStatus::Rehydrated {
            rehydration =
                rehydrate(state, policy, &plan.record().reason, &HashSet::new(), &HashSet::new());
            items.extend(rehydration.message.take());
        }
        let mut parts =
            vec![text_part(instruction_block(mode, open.and_then(|t| t.instruction.as_deref())))];
        if let Some(solution) = &state.solution_context {
            parts.push(text_part(solution_context_text(solution)));
            solution_sha = Some(sha256_hex(solution));
        }
        items.push(user_message_of(parts));
        items.extend(pending.iter().map(call_item));
    }
    let outputs = result_items(pending, continuation.results());
    let tool_outputs = outputs.iter().map(|(_, record)| record.clone()).collect();
    items.extend(outputs.into_iter().map(|(item, _)| item));
    // Within the turn's mode: a steer adds to the turn, it does not change how it runs.
    for steer in steers {
        items.push(user_message_of(vec![text_part(instruction_block(
            mode,
            Some(&steer.instruction),
        ))]));
    }

    let previous = continuing.map(|c| c.previous_response_id.as_str());
    let call = Call {
        previous_response_id: previous,
        stream,
        choice: ToolChoice::Relax,
        prompt_cache_key: prompt_cache_key(policy, &continuation.key().session_id),
        mcp_tools: input.mcp_tools,
    };
    let body = envelope(context, call, items);
    let record = SentRecord {
        turn_id: turn_id.clone(),
        kind: TurnKind::ToolContinuation,
        chain: plan.record().clone(),
        chunks: rehydration.chunks.clone(),
        chunks_already_sent: Vec::new(),
        chunks_superseded: Vec::new(),
        files: rehydration.files.clone(),
        files_unchanged: Vec::new(),
        skipped_files: Vec::new(),
        solution_context_sent: solution_sha.is_some(),
        images: Vec::new(),
        tool_outputs,
        rehydration: (plan.record().status == ChainStatus::Rehydrated)
            .then(|| rehydration.record.clone()),
        user_warnings: rehydration.warning.iter().cloned().collect(),
        mode_changed_to: None,
        steered_by: steers.iter().map(|s| s.turn_id.clone()).collect(),
    };
    let update = StateUpdate {
        turn_id,
        kind: TurnKind::ToolContinuation,
        mode: mode.to_owned(),
        // What steered the turn joins its instruction, for the transcript a new chain replays.
        instruction: (!steers.is_empty()).then(|| {
            steers.iter().map(|s| s.instruction.as_str()).collect::<Vec<_>>().join("\n\n")
        }),
        new_chain: continuing.is_none(),
        chunks: Vec::new(),
        rehydrated_chunk_ids: rehydration.chunk_ids(),
        files: Vec::new(),
        rehydrated_files: rehydration.file_hashes(),
        skipped_paths: Vec::new(),
        latched_solution_context: None,
        solution_context_sent_sha256: solution_sha,
        boot_prompt_sha256: continuing.is_none().then(|| sha256_hex(&context.system_prompt)),
    };
    Ok(Assembled { body: RequestBody::new(&body), record, update })
}
