//! The rules of a Tool Continuation Submission: only `SessionId`, `TurnId` and `ToolResults`,
//! at least one result, unique call ids, exactly one outcome each, `ResultJson` valid JSON.

use std::collections::HashSet;

use super::errors::Errors;
use super::skim::Skip;
use super::Limits;
use crate::contracts::ids::clip;
use crate::contracts::request::ToolResultWire;
use crate::contracts::{AgentExecuteRequest, ErrorCode, ToolOutcome, ToolResult};

pub(super) fn continuation(
    e: &mut Errors,
    w: AgentExecuteRequest,
    limits: &Limits,
) -> Option<Vec<ToolResult>> {
    let present = [
        ("Instruction", w.instruction.is_some()),
        ("InputArtifacts", w.input_artifacts.is_some()),
        ("ClipboardImages", w.clipboard_images.is_some()),
        ("RagScope", w.rag_scope.is_some()),
        ("SolutionContextText", w.solution_context_text.is_some()),
        ("WorkspaceId", w.workspace_id.is_some()),
        ("Repo", w.repo.is_some()),
        ("Language", w.language.is_some()),
        ("Stream", w.stream.is_some()),
        ("AgentContextId", w.agent_context_id.is_some()),
        ("ConversationContextId", w.conversation_context_id.is_some()),
        ("FollowUp", w.follow_up.is_some()),
    ];
    for (field, _) in present.iter().filter(|(_, p)| *p) {
        e.at(
            ErrorCode::ContinuationFieldForbidden,
            *field,
            format!("a Tool Continuation Submission carries only SessionId, TurnId and ToolResults; remove `{field}`"),
        );
    }
    let wires = w.tool_results.unwrap_or_default();
    if wires.is_empty() {
        e.at(ErrorCode::ToolResultsEmpty, "ToolResults", "ToolResults is present but empty");
        return None;
    }
    e.limit("ToolResults", "results", wires.len(), "max_tool_results", limits.max_tool_results);
    let mut seen = HashSet::new();
    let results: Vec<Option<ToolResult>> = wires
        .into_iter()
        .enumerate()
        .map(|(i, r)| tool_result(e, i, r, &mut seen, limits))
        .collect();
    results.into_iter().collect()
}

fn tool_result(
    e: &mut Errors,
    i: usize,
    r: ToolResultWire,
    seen: &mut HashSet<String>,
    limits: &Limits,
) -> Option<ToolResult> {
    let f = |name: &str| format!("ToolResults[{i}].{name}");
    let id = match r.tool_call_id.filter(|s| !s.is_empty()) {
        None => {
            e.at(ErrorCode::ToolCallIdMissing, f("ToolCallId"), "ToolCallId is required");
            None
        }
        Some(id)
            if e.chars_limit(&f("ToolCallId"), &id, "max_name_chars", limits.max_name_chars) =>
        {
            None
        }
        Some(id) if !seen.insert(id.clone()) => {
            e.at(
                ErrorCode::ToolCallIdDuplicate,
                f("ToolCallId"),
                format!("ToolCallId `{}` appears more than once", clip(&id)),
            );
            None
        }
        Some(id) => Some(id),
    };
    if r.execution_ms.is_none() {
        e.at(ErrorCode::ExecutionMsMissing, f("ExecutionMs"), "ExecutionMs is required");
    }
    let outcome = outcome(e, i, r.result_json, r.error_message, limits);
    Some(ToolResult {
        tool_call_id: id?,
        name: None,
        execution_ms: r.execution_ms?,
        outcome: outcome?,
    })
}

/// A result's outcome: exactly one of `ResultJson` (valid JSON) and `ErrorMessage`, each within
/// `limits.max_tool_result_bytes`.
fn outcome(
    e: &mut Errors,
    i: usize,
    result_json: Option<String>,
    error_message: Option<String>,
    limits: &Limits,
) -> Option<ToolOutcome> {
    let f = |name: &str| format!("ToolResults[{i}].{name}");
    match (result_json, error_message) {
        (Some(json), None) => {
            e.limit(
                &f("ResultJson"),
                "bytes",
                json.len(),
                "max_tool_result_bytes",
                limits.max_tool_result_bytes,
            );
            // Checked without building it: a tree of a large document costs many times its size.
            match serde_json::from_str::<Skip>(&json) {
                Ok(_) => Some(ToolOutcome::ResultJson(json)),
                Err(err) => {
                    e.at(
                        ErrorCode::ToolResultJsonInvalid,
                        f("ResultJson"),
                        format!("ResultJson is not valid JSON: {err}"),
                    );
                    None
                }
            }
        }
        (None, Some(msg)) => {
            e.limit(
                &f("ErrorMessage"),
                "bytes",
                msg.len(),
                "max_tool_result_bytes",
                limits.max_tool_result_bytes,
            );
            Some(ToolOutcome::ErrorMessage(msg))
        }
        (both, _) => {
            let which = if both.is_some() { "both" } else { "neither" };
            e.at(
                ErrorCode::ToolResultOutcome,
                format!("ToolResults[{i}]"),
                format!("a tool result has exactly one of ResultJson and ErrorMessage; this one has {which}"),
            );
            None
        }
    }
}
