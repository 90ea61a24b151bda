//! The AGN-033 `AgentExecuteResponse`, wrapped in `InvokeResult<T>`.
//!
//! The bucket rules of AGN-033 §3.4 are encoded in the types: a `final` response has no field for
//! `ToolCalls`, a `client_tool_continuation` has none for `PrimaryOutputText`, `Files`,
//! `ToolResults`, `UserWarnings` or `Usage`, and empty optional buckets are left out of the JSON.
//! Deserializing rejects a forbidden bucket, so the same holds for replies read back.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::ids::{SessionId, TurnId};

/// The result of one agent turn, as the client sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase")]
pub struct AgentExecuteResponse {
    /// The session.
    #[schemars(with = "uuid::Uuid")]
    pub session_id: SessionId,
    /// The turn; a follow-on request needs exactly `SessionId + TurnId`.
    #[schemars(with = "String")]
    pub turn_id: TurnId,
    /// Display-only mode name; clients must not branch on it.
    pub mode_display_name: String,
    /// `final` or `client_tool_continuation`, with exactly the buckets that kind allows.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// The response kind and its buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "Kind")]
pub enum Outcome {
    /// A completed, user-rendered answer.
    #[serde(rename = "final")]
    Final(FinalOutput),
    /// The client must run the listed tools and submit their results.
    #[serde(rename = "client_tool_continuation")]
    ClientToolContinuation(ToolContinuationOutput),
    /// Server tool calls wait for the client's approval (protocol version 3): the client
    /// answers with a Tool Approval Submission.
    #[serde(rename = "tool_approval_required")]
    ToolApprovalRequired(super::ToolApprovalOutput),
}

/// Buckets of a `final` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct FinalOutput {
    /// Markdown shown to the user (exactly one).
    pub primary_output_text: String,
    /// Files produced, by reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRef>,
    /// Results of tools the server ran itself (visibility only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResult>,
    /// Non-fatal warnings for the user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_warnings: Vec<UserWarning>,
    /// Token usage of the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl FinalOutput {
    /// A final answer with no optional buckets.
    pub fn text(primary_output_text: impl Into<String>) -> Self {
        FinalOutput {
            primary_output_text: primary_output_text.into(),
            files: Vec::new(),
            tool_results: Vec::new(),
            user_warnings: Vec::new(),
            usage: None,
        }
    }
}

/// Buckets of a `client_tool_continuation` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields, try_from = "ToolContinuationShape")]
pub struct ToolContinuationOutput {
    /// The exact, ordered set of calls the client must run (one or more).
    tool_calls: Vec<ToolCall>,
    /// Informational text; never actionable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_continuation_message: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct ToolContinuationShape {
    /// The exact, ordered set of calls the client must run (one or more).
    #[schemars(length(min = 1))]
    tool_calls: Vec<ToolCall>,
    /// Informational text; never actionable.
    #[serde(default)]
    tool_continuation_message: Option<String>,
}

impl TryFrom<ToolContinuationShape> for ToolContinuationOutput {
    type Error = &'static str;

    fn try_from(s: ToolContinuationShape) -> Result<Self, Self::Error> {
        ToolContinuationOutput::new(s.tool_calls, s.tool_continuation_message)
            .ok_or("ToolCalls must hold at least one call")
    }
}

impl ToolContinuationOutput {
    /// Builds the bucket set; `None` when `tool_calls` is empty (AGN-033 requires one or more).
    pub fn new(tool_calls: Vec<ToolCall>, message: Option<String>) -> Option<Self> {
        (!tool_calls.is_empty())
            .then_some(ToolContinuationOutput { tool_calls, tool_continuation_message: message })
    }

    /// The calls, in the order the client must answer them.
    pub fn tool_calls(&self) -> &[ToolCall] {
        &self.tool_calls
    }

    /// The informational message, if any.
    pub fn message(&self) -> Option<&str> {
        self.tool_continuation_message.as_deref()
    }
}

/// A tool call the client must execute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ToolCall {
    /// Identifier to echo in the matching `ToolResult`.
    pub tool_call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as a JSON document (string).
    pub arguments_json: String,
}

/// The result of one tool call: `ResultJson` or `ErrorMessage`, never both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase")]
pub struct ToolResult {
    /// The call this answers.
    pub tool_call_id: String,
    /// The tool's name: set on the server's own executions in a final response's
    /// `ToolResults`; a client's results do not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Execution time in milliseconds.
    pub execution_ms: u64,
    /// The outcome.
    #[serde(flatten)]
    pub outcome: ToolOutcome,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ToolOutcome {
    /// The tool's result, a JSON document.
    #[serde(rename = "ResultJson")]
    ResultJson(String),
    /// Why the tool failed.
    #[serde(rename = "ErrorMessage")]
    ErrorMessage(String),
}

/// A file produced by the turn, referenced rather than embedded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct FileRef {
    /// File name.
    pub name: String,
    /// MIME type.
    pub mime_type: String,
    /// Where to fetch it.
    pub url: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Content hash (`sha256:<hex>`).
    pub content_hash: String,
    /// Optional description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// ISO-8601 expiry; absent means no expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_expires: Option<String>,
}

/// Token usage of a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens, reasoning ones included.
    pub output_tokens: u64,
    /// Input plus output.
    pub total_tokens: u64,
    /// Input tokens served from the provider's cache.
    pub cached_input_tokens: u64,
    /// Output tokens spent on reasoning.
    pub reasoning_tokens: u64,
}

/// A non-fatal, user-relevant warning on a final response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct UserWarning {
    /// Stable dotted code, e.g. `files.skipped_too_large`.
    pub code: String,
    /// Explanation for the user.
    pub message: String,
}

/// The envelope of every reply: success with a result, or failure with errors and no result.
///
/// `SessionId` and `TurnId` name the session and turn the reply concerns, so a body read
/// without its AMQP headers (a log, a stored record) still says which turn it answers; each is
/// left out when the request named no valid one (issue 41). Bodies written before they existed
/// read back with both absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields, try_from = "InvokeShape<T>")]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct InvokeResult<T> {
    successful: bool,
    result: Option<T>,
    errors: Vec<ApiError>,
    warnings: Vec<ApiError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<uuid::Uuid>")]
    session_id: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    turn_id: Option<TurnId>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
#[schemars(rename = "InvokeResult")]
struct InvokeShape<T> {
    /// `true` with a `Result` and no `Errors`; `false` with `Errors` and a null `Result`.
    successful: bool,
    /// The response of a successful invocation.
    result: Option<T>,
    /// Why the invocation failed.
    #[serde(default)]
    errors: Vec<ApiError>,
    /// System-level warnings.
    #[serde(default)]
    warnings: Vec<ApiError>,
    /// The session the reply concerns; absent only when the request named no valid `SessionId`.
    #[serde(default)]
    #[schemars(with = "Option<uuid::Uuid>")]
    session_id: Option<SessionId>,
    /// The turn the reply concerns; absent only when the request named no valid `TurnId`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    turn_id: Option<TurnId>,
}

impl<T> TryFrom<InvokeShape<T>> for InvokeResult<T> {
    type Error = &'static str;

    fn try_from(s: InvokeShape<T>) -> Result<Self, Self::Error> {
        match (s.successful, &s.result, s.errors.is_empty()) {
            (true, Some(_), true) | (false, None, false) => Ok(InvokeResult {
                successful: s.successful,
                result: s.result,
                errors: s.errors,
                warnings: s.warnings,
                session_id: s.session_id,
                turn_id: s.turn_id,
            }),
            (true, _, _) => Err("a successful InvokeResult has a Result and no Errors"),
            (false, _, _) => Err("a failed InvokeResult has Errors and a null Result"),
        }
    }
}

impl InvokeResult<AgentExecuteResponse> {
    /// This ending told to `turn`, a follow-up that steered the turn it ends: about that turn,
    /// without the usage (the tokens were the steered turn's), with `warning` saying so.
    pub fn retold(mut self, turn: TurnId, warning: ApiError) -> Self {
        if let Some(r) = &mut self.result {
            r.turn_id = turn.clone();
            if let Outcome::Final(f) = &mut r.outcome {
                f.usage = None;
            }
        }
        self.turn_id = Some(turn);
        self.warnings.push(warning);
        self
    }
}

impl<T> InvokeResult<T> {
    /// A successful result.
    pub fn ok(result: T) -> Self {
        InvokeResult {
            successful: true,
            result: Some(result),
            errors: Vec::new(),
            warnings: Vec::new(),
            session_id: None,
            turn_id: None,
        }
    }

    /// A failed result; `errors` must not be empty (an empty list gets an `internal.error`).
    pub fn fail(mut errors: Vec<ApiError>) -> Self {
        if errors.is_empty() {
            errors.push(ApiError::new(super::ErrorCode::Internal, "failed without a stated cause"));
        }
        InvokeResult {
            successful: false,
            result: None,
            errors,
            warnings: Vec::new(),
            session_id: None,
            turn_id: None,
        }
    }

    /// Adds system-level warnings.
    pub fn with_warnings(mut self, warnings: Vec<ApiError>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    /// Names the session and turn the reply concerns (`SessionId`, `TurnId`); a turn of `None`
    /// (the request named no valid one) is left out of the body.
    pub fn about(mut self, session: SessionId, turn: Option<TurnId>) -> Self {
        self.session_id = Some(session);
        self.turn_id = turn;
        self
    }

    /// Whether the invocation succeeded.
    pub fn successful(&self) -> bool {
        self.successful
    }

    /// The result of a successful invocation.
    pub fn result(&self) -> Option<&T> {
        self.result.as_ref()
    }

    /// The errors of a failed invocation.
    pub fn errors(&self) -> &[ApiError] {
        &self.errors
    }

    /// System-level warnings.
    pub fn warnings(&self) -> &[ApiError] {
        &self.warnings
    }

    /// The session the reply concerns, when known.
    pub fn session_id(&self) -> Option<SessionId> {
        self.session_id
    }

    /// The turn the reply concerns, when known.
    pub fn turn_id(&self) -> Option<&TurnId> {
        self.turn_id.as_ref()
    }
}
