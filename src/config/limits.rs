//! The `[limits]` configuration section: every size, length and count a request is held to at
//! ingress. Each error that trips one names its key.

use serde::{Deserialize, Serialize};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// Size, length and count limits applied at ingress. `Default` is exactly the `[limits]` section
/// of `aptix.example.toml` (a test keeps the two equal).
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
    /// Most `Values` in one `RagScope` condition.
    pub max_rag_scope_values: usize,
    /// Longest `RagScope` value, in characters.
    pub max_rag_scope_value_chars: usize,
    /// Longest artifact `RelativePath`, in characters.
    pub max_path_chars: usize,
    /// Longest name-like value, in characters: artifact `FileName`, `Language` and `MimeType`,
    /// image `Id` and `MimeType`, `ToolCallId`, `RagScope` `Key`.
    pub max_name_chars: usize,
    /// Most errors listed in one reply; one more entry (`request.too_many_errors`) counts the rest.
    pub max_errors: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 4 * MIB,
            max_instruction_chars: 200_000,
            max_solution_context_chars: 50_000,
            max_hint_chars: 512,
            max_artifacts: 64,
            max_artifact_bytes: 2 * MIB,
            max_images: 10,
            max_image_bytes: 2 * MIB,
            max_tool_results: 64,
            max_tool_result_bytes: MIB,
            max_rag_scope_conditions: 32,
            max_rag_scope_values: 64,
            max_rag_scope_value_chars: 512,
            max_path_chars: 1024,
            max_name_chars: 512,
            max_errors: 20,
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
            max_rag_scope_values: usize::MAX,
            max_rag_scope_value_chars: usize::MAX,
            max_path_chars: usize::MAX,
            max_name_chars: usize::MAX,
            max_errors: usize::MAX,
        }
    }

    /// Checks the values themselves; the error names the key (`limits.max_errors`).
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.max_errors == 0 {
            return Err(("limits.max_errors".into(), "must be at least 1".into()));
        }
        Ok(())
    }
}
