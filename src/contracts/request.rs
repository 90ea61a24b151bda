//! The AGN-034 `AgentExecuteRequest` exactly as it travels on the wire.
//!
//! These types only describe JSON shape: every property is optional so that a missing one becomes
//! a specific validation error instead of a generic parse failure. Nothing downstream of the
//! validate stage uses them; it uses [`crate::contracts::validated`] instead.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An `AgentExecuteRequest` as published by a backend (User Turn Request or Tool Continuation
/// Submission; the scenario follows from which properties are present).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
#[schemars(title = "AgentExecuteRequest")]
pub struct AgentExecuteRequest {
    /// Session identifier (UUID). An unknown session is created by its first user turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Client-chosen turn identifier, unique within the session: 1-128 of `[A-Za-z0-9._:-]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The user's instruction (Markdown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    /// Files supplied for this turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_artifacts: Option<Vec<InputArtifactWire>>,
    /// Images pasted from the clipboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clipboard_images: Option<Vec<ClipboardImageWire>>,
    /// Retrieval scope conditions, ANDed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rag_scope: Option<Vec<RagScopeConditionWire>>,
    /// Session-latched description of the solution or workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solution_context_text: Option<String>,
    /// Identifier of the developer's working copy (advisory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// Repository name; restricts retrieval to that repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Language hint (advisory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Streaming preference; defaults to `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Selects a server-configured AgentContext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_context_id: Option<String>,
    /// Selects a server-configured ConversationContext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_context_id: Option<String>,
    /// What this user turn does if its session is busy: `enqueue`, `reject`, `interrupt` or `steer`,
    /// among those its ConversationContext allows; absent: the context's own `follow_up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up: Option<String>,
    /// Results of the tool calls the previous reply asked for (Tool Continuation Submission only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_results: Option<Vec<ToolResultWire>>,
    /// The client's decision on each call of a `tool_approval_required` reply, in its order
    /// (Tool Approval Submission only; protocol version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_approvals: Option<Vec<super::approval::ToolApprovalWire>>,
}

/// Every property name [`AgentExecuteRequest`] accepts, in wire spelling.
pub const REQUEST_FIELDS: &[&str] = &[
    "SessionId",
    "TurnId",
    "Instruction",
    "InputArtifacts",
    "ClipboardImages",
    "RagScope",
    "SolutionContextText",
    "WorkspaceId",
    "Repo",
    "Language",
    "Stream",
    "AgentContextId",
    "ConversationContextId",
    "FollowUp",
    "ToolResults",
    "ToolApprovals",
];

/// Properties that name server-owned state. AGN-034 forbids them; they get
/// `request.forbidden_field` rather than `request.unknown_field` so the client learns why.
pub const FORBIDDEN_FIELDS: &[&str] = &[
    "Mode",
    "ModeDisplayName",
    "ConversationId",
    "ResponseContinuationId",
    "previous_response_id",
    "PreviousResponseId",
    "ToolsJson",
    "Tools",
    "ToolChoiceName",
    "ToolChoice",
    "Model",
    "Temperature",
    "SystemPrompt",
    "AgentContext",
    "ConversationContext",
];

/// One entry of `InputArtifacts[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct InputArtifactWire {
    /// Path relative to the opened root folder: no leading `/` or `\`, no drive letter, no `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_path: Option<String>,
    /// File name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// File contents, as text or base64 (see `Encoding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
    /// `ide` or `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Optional MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Optional language tag used for the code fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// `utf8` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
}

/// One entry of `ClipboardImages[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ClipboardImageWire {
    /// Client identifier of the image, unique within the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `image/*` MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Image bytes, standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

/// One `RagScope` condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct RagScopeConditionWire {
    /// Payload key, e.g. `path`, `language`, `repo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `==`, `!=`, `contains` or `does_not_contain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// One or more values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
}

/// One entry of `ToolResults[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ToolResultWire {
    /// The `ToolCallId` of the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// How long the tool ran, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_ms: Option<u64>,
    /// The tool's result as a JSON document (a string holding JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_json: Option<String>,
    /// Why the tool failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}
