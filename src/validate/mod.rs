//! Validation of AGN-034 requests: raw bytes in, a [`ValidatedRequest`] or a list of specific
//! errors out. Only rules that need no stored state live here; session and turn rules belong to
//! the validate stage.

mod attachments;
mod parse;
mod rules;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::contracts::{AgentExecuteRequest, ApiError, SessionId, ValidatedRequest};

pub use parse::{parse_bytes, turn_hint};

/// Size and count limits applied at ingress. Every error that trips one names the limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted message body, in bytes.
    pub max_request_bytes: usize,
    /// Longest `Instruction`, in characters.
    pub max_instruction_chars: usize,
    /// Longest `SolutionContextText`, in characters.
    pub max_solution_context_chars: usize,
    /// Longest `WorkspaceId`, `Repo` or `Language` hint, in characters.
    pub max_hint_chars: usize,
    /// Most `InputArtifacts` in one request.
    pub max_artifacts: usize,
    /// Largest decoded artifact, in bytes.
    pub max_artifact_bytes: usize,
    /// Most `ClipboardImages` in one request.
    pub max_images: usize,
    /// Largest decoded image, in bytes.
    pub max_image_bytes: usize,
    /// Most `ToolResults` in one submission.
    pub max_tool_results: usize,
    /// Largest `ResultJson` or `ErrorMessage`, in bytes.
    pub max_tool_result_bytes: usize,
    /// Most `RagScope` conditions.
    pub max_rag_scope_conditions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 16 * 1024 * 1024,
            max_instruction_chars: 200_000,
            max_solution_context_chars: 50_000,
            max_hint_chars: 512,
            max_artifacts: 64,
            max_artifact_bytes: 4 * 1024 * 1024,
            max_images: 10,
            max_image_bytes: 10 * 1024 * 1024,
            max_tool_results: 64,
            max_tool_result_bytes: 1024 * 1024,
            max_rag_scope_conditions: 32,
        }
    }
}

impl Limits {
    /// No size or count limits: only the structural rules. Used when re-reading a request that
    /// already passed ingress, so a later change of configured limits cannot strand it.
    pub fn structural_only() -> Self {
        Limits {
            max_request_bytes: usize::MAX,
            max_instruction_chars: usize::MAX,
            max_solution_context_chars: usize::MAX,
            max_hint_chars: usize::MAX,
            max_artifacts: usize::MAX,
            max_artifact_bytes: usize::MAX,
            max_images: usize::MAX,
            max_image_bytes: usize::MAX,
            max_tool_results: usize::MAX,
            max_tool_result_bytes: usize::MAX,
            max_rag_scope_conditions: usize::MAX,
        }
    }
}

/// One or more validation failures, in the order they were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ApiError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}

/// Validates a message body: parsing, field names and types, then every AGN-034 rule.
pub fn validate_bytes(bytes: &[u8], limits: &Limits) -> Result<ValidatedRequest, ValidationErrors> {
    let wire = parse_bytes(bytes, limits)?;
    validate_wire(wire, limits)
}

/// Applies the AGN-034 rules to an already-parsed request.
pub fn validate_wire(
    wire: AgentExecuteRequest,
    limits: &Limits,
) -> Result<ValidatedRequest, ValidationErrors> {
    rules::validate(wire, limits)
}

/// Best-effort `SessionId` of a message that may be invalid, so its error reply can still reach
/// the session's queue. `None` when the body carries no readable session id.
pub fn session_hint(bytes: &[u8]) -> Option<SessionId> {
    turn_hint(bytes).0
}
