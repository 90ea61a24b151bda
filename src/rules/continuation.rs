//! The rules of a Tool Continuation Submission: only `SessionId`, `TurnId` and `ToolResults`
//! (or, a Tool Approval Submission, `ToolApprovals`: `approvals.rs`), at least one result,
//! unique call ids, exactly one outcome each, `ResultJson` valid JSON.

use std::collections::HashSet;

use super::errors::Errors;
use super::skim::Skip;
use super::Limits;
use crate::contracts::request::ToolResultWire;
use crate::contracts::{AgentExecuteRequest, ErrorCode, ToolApproval, ToolOutcome, ToolResult};

/// What a continuation answers with: results, or decisions on calls awaiting approval.
pub(super) type Answers = (Vec<ToolResult>, Vec<ToolApproval>);

pub(super) fn continuation(
    e: &mut Errors,
    mut w: AgentExecuteRequest,
    limits: &Limits,
) -> Option<Answers> {
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
            format!("a Tool Continuation Submission carries only SessionId, TurnId and ToolResults (or ToolApprovals); remove `{field}`"),
        );
    }
    if let Some(wires) = w.tool_approvals.take() {
        if w.tool_results.is_some() {
            e.at(
                ErrorCode::ContinuationFieldForbidden,
                "ToolApprovals",
                "a submission carries ToolResults or ToolApprovals, not both",
            );
            return None;
        }
        return super::approvals::approvals(e, wires, limits).map(|a| (Vec::new(), a));
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
    let results: Option<Vec<ToolResult>> = results.into_iter().collect();
    results.map(|r| (r, Vec::new()))
}

fn tool_result(
    e: &mut Errors,
    i: usize,
    r: ToolResultWire,
    seen: &mut HashSet<String>,
    limits: &Limits,
) -> Option<ToolResult> {
    let f = |name: &str| format!("ToolResults[{i}].{name}");
    let id = super::approvals::call_id(e, &f("ToolCallId"), r.tool_call_id, seen, limits);
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
