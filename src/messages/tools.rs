//! Server-executed tools as a turn carries them: the calls still to run before its next
//! provider call, and every execution so far (stored on the turn between round trips, listed
//! in the final response's `ToolResults` and `Files`).

use serde::{Deserialize, Serialize};

use crate::contracts::{FileRef, ToolCall, ToolResult};

/// One server tool execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerExecution {
    /// The round trip whose answer called it.
    pub step: i32,
    /// The call, as the model made it.
    pub call: ToolCall,
    /// Its result, as sent to the model (`Name` set, for the final response).
    pub result: ToolResult,
    /// The file it produced, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileRef>,
}

/// The round trips of a turn that ran server tools, given its executions.
pub fn server_rounds(executed: &[ServerExecution]) -> usize {
    let mut steps: Vec<i32> = executed.iter().map(|e| e.step).collect();
    steps.dedup();
    steps.len()
}
