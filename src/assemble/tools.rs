//! Tool continuations (DESIGN.md §2, §5.4; AGN-033 §3.3): the exact-match check of submitted
//! results against the pending calls, and the `function_call` / `function_call_output` items.

use serde_json::{json, Value};

use super::record::SentToolOutput;
use crate::contracts::{ApiError, ErrorCode, ToolCall, ToolContinuation, ToolOutcome, ToolResult};

/// The submitted tool results do not match the pending calls in count, ids and order: a hard
/// fault that aborts the turn (`tool_results.mismatch`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool results do not match the pending tool calls: {detail}")]
pub struct ToolResultsMismatch {
    /// What differs, naming positions and ids.
    pub detail: String,
}

impl ToolResultsMismatch {
    /// The `InvokeResult` error for the client.
    pub fn to_api_error(&self) -> ApiError {
        ApiError::at(ErrorCode::ToolResultsMismatch, "ToolResults", self.to_string())
    }
}

/// Checks that `continuation` answers exactly `pending`: same count, same ids, same order.
pub fn check_tool_results(
    pending: &[ToolCall],
    continuation: &ToolContinuation,
) -> Result<(), ToolResultsMismatch> {
    let results = continuation.results();
    let ids = |ids: Vec<&str>| format!("[{}]", ids.join(", "));
    if results.len() != pending.len() {
        return Err(ToolResultsMismatch {
            detail: format!(
                "{} pending calls {} but {} results {}",
                pending.len(),
                ids(pending.iter().map(|c| c.tool_call_id.as_str()).collect()),
                results.len(),
                ids(results.iter().map(|r| r.tool_call_id.as_str()).collect()),
            ),
        });
    }
    for (i, (call, result)) in pending.iter().zip(results).enumerate() {
        if call.tool_call_id != result.tool_call_id {
            return Err(ToolResultsMismatch {
                detail: format!(
                    "result {} answers `{}` but call {} is `{}`",
                    i + 1,
                    result.tool_call_id,
                    i + 1,
                    call.tool_call_id
                ),
            });
        }
    }
    Ok(())
}

/// The text sent for a result: the tool's JSON, or a message that says it failed and why.
fn output_text(call: &ToolCall, result: &ToolResult) -> (String, bool) {
    match &result.outcome {
        ToolOutcome::ResultJson(json) => (json.clone(), false),
        ToolOutcome::ErrorMessage(message) => {
            (format!("ERROR: the tool `{}` failed: {message}", call.name), true)
        }
    }
}

/// A `function_call_output` item with its record entry.
fn output_item(call: &ToolCall, output: String, failed: bool) -> (Value, SentToolOutput) {
    let item =
        json!({ "type": "function_call_output", "call_id": call.tool_call_id, "output": output });
    (item, SentToolOutput { call_id: call.tool_call_id.clone(), name: call.name.clone(), failed })
}

/// The output items answering `pending` with `results` (already checked to match), in order.
pub(crate) fn result_items(
    pending: &[ToolCall],
    results: &[ToolResult],
) -> Vec<(Value, SentToolOutput)> {
    pending
        .iter()
        .zip(results)
        .map(|(call, result)| {
            let (text, failed) = output_text(call, result);
            output_item(call, text, failed)
        })
        .collect()
}

/// Output items for calls a turn left unanswered before it was abandoned: the chain rejects any
/// further input until every call of its last response has an output.
pub(crate) fn abandoned_items(pending: &[ToolCall]) -> Vec<(Value, SentToolOutput)> {
    pending
        .iter()
        .map(|call| {
            let text = format!(
                "ERROR: the tool `{}` was not run: the turn that requested it was abandoned.",
                call.name
            );
            output_item(call, text, true)
        })
        .collect()
}

/// The `function_call` item replaying `call` into a new chain (no item id: the provider's
/// stored item may be gone, and a replayed id would be looked up).
pub(crate) fn call_item(call: &ToolCall) -> Value {
    json!({
        "type": "function_call",
        "call_id": call.tool_call_id,
        "name": call.name,
        "arguments": call.arguments_json,
    })
}
