//! Assembling a User Turn Request: the chain decision, the chunk and file deltas, rehydration of
//! a new chain, and the user message.

use std::collections::HashSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::body::{envelope, prompt_cache_key, Call, ToolChoice};
use super::chain::{plan_chain, split_chunks, ChainPlan};
use super::files::{select_files, sent_file, skip_warning, FileSelection};
use super::message::{mode_change_message, system_message, user_message, UserContent};
use super::record::{ChainStatus, SentChunk, SentRecord, SentToolOutput, TurnKind};
use super::rehydrate::{rehydrate, Rehydration};
use super::state::{ChainState, StateUpdate};
use super::tools::abandoned_items;
use super::{AssembleInput, Assembled};
use crate::chunk::Chunk;
use crate::contracts::UserTurn;
use crate::llm::RequestBody;

/// SHA-256 (lowercase hex) of a text or of bytes.
pub(crate) fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

/// Builds the request for a user turn with its retrieved `chunks`.
pub(crate) fn assemble_user_turn(
    input: &AssembleInput<'_>,
    turn: &UserTurn,
    chunks: &[Chunk],
) -> Assembled {
    let (state, context, policy) = (input.state, input.context, input.policy);
    let plan = plan_chain(state, policy, input.now);
    let continuing = plan.continuing();
    let files = select_files(turn.artifacts(), continuing, policy);
    let (chunks, superseded) = without_local_files(chunks, &files, continuing);
    let (send_chunks, already_sent) = split_chunks(&plan, &chunks);

    // AGN-034 §4.5: a sent solution context replaces the latched one. It goes to the model when
    // the chain is new or does not hold this exact text yet.
    let latched = turn.solution_context().or(state.solution_context.as_deref());
    let solution = latched.map(|text| (text, sha256_hex(text))).filter(|(_, sha)| {
        continuing.is_none_or(|c| c.solution_context_sha256.as_deref() != Some(sha.as_str()))
    });

    let (mut items, mut rehydration, tool_outputs) =
        opening_items(input, turn, &plan, &send_chunks);
    // A chain started now carries this mode's boot prompt; a continued one that follows another
    // mode's gets this one as a developer message, and follows it from then on.
    let prompt_sha = sha256_hex(&context.system_prompt);
    let mode_changed =
        continuing.is_some() && state.follows_other_prompt(&prompt_sha, &context.mode);
    if mode_changed {
        items.push(mode_change_message(&context.mode, &context.system_prompt));
    }
    let sent_prompt = (continuing.is_none() || mode_changed).then_some(prompt_sha);
    items.push(user_message(&UserContent {
        mode: &context.mode,
        instruction: turn.instruction(),
        chunks: &send_chunks,
        files: &files.send,
        skipped: &files.skipped,
        solution_context: solution.as_ref().map(|(text, _)| *text),
        images: turn.images(),
    }));

    let previous = continuing.map(|c| c.previous_response_id.as_str());
    let call = Call {
        previous_response_id: previous,
        stream: turn.stream(),
        choice: ToolChoice::Enforce,
        prompt_cache_key: prompt_cache_key(policy, &turn.key().session_id),
        mcp_tools: input.mcp_tools,
    };
    let body = envelope(context, call, items);
    let mut user_warnings: Vec<_> = files.skipped.iter().map(skip_warning).collect();
    user_warnings.extend(rehydration.warning.take());
    let new_chain = continuing.is_none();

    let record = SentRecord {
        turn_id: turn.key().turn_id.to_string(),
        kind: TurnKind::UserTurn,
        chain: plan.record().clone(),
        chunks: rehydration
            .chunks
            .iter()
            .cloned()
            .chain(send_chunks.iter().map(|c| SentChunk::of(c, false)))
            .collect(),
        chunks_already_sent: already_sent.iter().map(|c| SentChunk::of(c, false)).collect(),
        chunks_superseded: superseded.iter().map(|c| SentChunk::of(c, false)).collect(),
        files: rehydration
            .files
            .iter()
            .cloned()
            .chain(files.send.iter().map(|f| sent_file(f, false)))
            .collect(),
        files_unchanged: files.unchanged,
        skipped_files: files.skipped.clone(),
        solution_context_sent: solution.is_some(),
        images: turn.images().iter().map(|i| i.id().to_owned()).collect(),
        tool_outputs,
        rehydration: (plan.record().status == ChainStatus::Rehydrated)
            .then(|| rehydration.record.clone()),
        user_warnings,
        steered_by: Vec::new(),
        mode_changed_to: mode_changed.then(|| context.mode.clone()),
    };
    let update = StateUpdate {
        turn_id: record.turn_id.clone(),
        kind: TurnKind::UserTurn,
        mode: context.mode.clone(),
        instruction: turn.instruction().map(str::to_owned),
        new_chain,
        chunks: send_chunks.into_iter().cloned().collect(),
        rehydrated_chunk_ids: rehydration.chunk_ids(),
        files: files.send,
        rehydrated_files: rehydration.file_hashes(),
        skipped_paths: files.skipped.into_iter().map(|f| f.path).collect(),
        latched_solution_context: turn.solution_context().map(str::to_owned),
        solution_context_sent_sha256: solution.map(|(_, sha)| sha),
        boot_prompt_sha256: sent_prompt,
    };
    Assembled { body: RequestBody::new(&body), record, update }
}

/// `chunks` without those of files the model has whole (local edits win over the index): the
/// turn's active files, sent or held unchanged, and the files the continued chain holds. The
/// second list is the chunks left out. Skipped files (too large, binary) are not the model's, so
/// their indexed chunks stay.
fn without_local_files(
    chunks: &[Chunk],
    files: &FileSelection,
    chain: Option<&ChainState>,
) -> (Vec<Chunk>, Vec<Chunk>) {
    let mut local: HashSet<&str> = files.send.iter().map(|f| f.path.as_str()).collect();
    local.extend(files.unchanged.iter().map(|f| f.path.as_str()));
    local.extend(chain.map_or(&[][..], |c| &c.files[..]).iter().map(|f| f.path.as_str()));
    chunks.iter().cloned().partition(|c| !local.contains(c.path.as_str()))
}

/// The items before the user message: a new chain's system prompt (and rehydrated history),
/// or outputs for calls a continued chain left unanswered.
fn opening_items(
    input: &AssembleInput<'_>,
    turn: &UserTurn,
    plan: &ChainPlan<'_>,
    send_chunks: &[&Chunk],
) -> (Vec<Value>, Rehydration, Vec<SentToolOutput>) {
    let (state, context, policy) = (input.state, input.context, input.policy);
    let mut items: Vec<Value> = Vec::new();
    let mut rehydration = Rehydration::default();
    let mut tool_outputs = Vec::new();
    match plan.continuing() {
        None => {
            items.push(system_message(&context.system_prompt));
            if plan.record().status == ChainStatus::Rehydrated {
                let sent: HashSet<&str> = send_chunks.iter().map(|c| c.id.as_str()).collect();
                let paths: HashSet<&str> =
                    turn.artifacts().iter().map(|a| a.path().as_str()).collect();
                rehydration = rehydrate(state, policy, &plan.record().reason, &sent, &paths);
                items.extend(rehydration.message.take());
            }
        }
        Some(_) => {
            // A turn abandoned while waiting for tool results left calls unanswered; the chain
            // refuses new input until each has an output.
            let pending = state.open_turn.as_ref().map_or(&[][..], |t| &t.pending_calls[..]);
            for (item, record) in abandoned_items(pending) {
                items.push(item);
                tool_outputs.push(record);
            }
        }
    }
    (items, rehydration, tool_outputs)
}
