//! Stable, dotted error codes and the `{Code, Message, Field}` error item of `InvokeResult`.
//!
//! Every code a client can ever see is listed once, here, with a one-line meaning. The README's
//! table is checked against this list by a test, so the two cannot drift apart.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($( $variant:ident => $code:literal, $meaning:literal; )*) => {
        /// A stable error code. The string form (`Code` in JSON) never changes once released.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode { $( #[doc = $meaning] $variant, )* }

        impl ErrorCode {
            /// Every code, in documentation order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$variant, )* ];

            /// The dotted wire form, e.g. `validation.path_absolute`.
            pub fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$variant => $code, )* }
            }

            /// One line saying when the code is produced.
            pub fn meaning(self) -> &'static str {
                match self { $( ErrorCode::$variant => $meaning, )* }
            }

            /// Looks a code up by its wire form.
            pub fn parse(code: &str) -> Option<ErrorCode> {
                match code { $( $code => Some(ErrorCode::$variant), )* _ => None }
            }
        }
    };
}

error_codes! {
    RequestTooLarge => "request.too_large", "the message body exceeds `limits.max_request_bytes` (a cancel's or a resume's: 4,096 bytes)";
    RequestInvalidUtf8 => "request.invalid_utf8", "the message body is not valid UTF-8";
    RequestInvalidJson => "request.invalid_json", "the message body is not well-formed JSON";
    RequestNotObject => "request.not_object", "the JSON document is not an object";
    RequestUnknownField => "request.unknown_field", "a property that AGN-034 does not define";
    RequestForbiddenField => "request.forbidden_field", "a server-owned property (mode, model or provider continuation state)";
    RequestInvalidType => "request.invalid_type", "a property has the wrong JSON type";
    RequestNulCharacter => "request.nul_character", "a string holds a NUL character (U+0000), which PostgreSQL cannot store; `Field` names it";
    RequestReplyToInvalid => "request.reply_to_invalid", "the AMQP `reply_to` property names neither the session's reply queue nor an instance queue `<prefix>.instance.<name>`";
    RequestTooManyErrors => "request.too_many_errors", "the request has more problems than `limits.max_errors`: the first ones are listed, this entry counts the rest";
    SessionIdMissing => "validation.session_id_missing", "`SessionId` is absent or empty";
    SessionIdInvalid => "validation.session_id_invalid", "`SessionId` is not a UUID";
    TurnIdMissing => "validation.turn_id_missing", "`TurnId` is absent or empty";
    TurnIdInvalid => "validation.turn_id_invalid", "`TurnId` is longer than 128 characters or uses characters outside `[A-Za-z0-9._:-]`";
    InstructionMissing => "validation.instruction_missing", "a user turn has none of `Instruction`, `InputArtifacts`, `ClipboardImages`";
    ContinuationFieldForbidden => "validation.continuation_field_forbidden", "a tool continuation carries a user-turn property (instruction, inputs, context, streaming)";
    ToolResultsEmpty => "validation.tool_results_empty", "`ToolResults` is present but empty";
    ToolApprovalsEmpty => "validation.tool_approvals_empty", "`ToolApprovals` is present but empty";
    ToolApprovalInvalid => "validation.tool_approval_invalid", "a decision of `ToolApprovals` has no `Approved`, or a `Message` on an approval (a message is for a denial)";
    ToolCallIdMissing => "validation.tool_call_id_missing", "a tool result or a decision has no `ToolCallId`";
    ToolCallIdDuplicate => "validation.tool_call_id_duplicate", "two tool results (or two decisions) share a `ToolCallId`";
    ExecutionMsMissing => "validation.execution_ms_missing", "a tool result has no `ExecutionMs`";
    ToolResultOutcome => "validation.tool_result_outcome", "a tool result has both or neither of `ResultJson` and `ErrorMessage`";
    ToolResultJsonInvalid => "validation.tool_result_json_invalid", "`ResultJson` is not valid JSON";
    PathMissing => "validation.path_missing", "an artifact has no `RelativePath`";
    PathAbsolute => "validation.path_absolute", "`RelativePath` starts with `/` or `\\`";
    PathDriveLetter => "validation.path_drive_letter", "`RelativePath` starts with a drive letter such as `C:`";
    PathTraversal => "validation.path_traversal", "`RelativePath` has a `..` segment";
    PathNul => "validation.path_nul", "`RelativePath` contains a NUL character";
    PathFormatCharacter => "validation.path_format_character", "`RelativePath` or `FileName` contains a control or invisible format character (Unicode Cf: bidi controls such as U+202E, zero-width characters such as U+200B)";
    PathDuplicate => "validation.path_duplicate", "two artifacts share a `RelativePath`";
    FileNameMissing => "validation.file_name_missing", "an artifact has no `FileName`";
    ContentsMissing => "validation.contents_missing", "an artifact has no `Contents`";
    OriginInvalid => "validation.origin_invalid", "`Origin` is absent or not `ide` / `user`";
    EncodingInvalid => "validation.encoding_invalid", "`Encoding` is not `utf8` or `base64`";
    ContentsBase64Invalid => "validation.contents_base64_invalid", "`Contents` is declared base64 but does not decode";
    ImageIdMissing => "validation.image_id_missing", "a clipboard image has no `Id`";
    ImageIdDuplicate => "validation.image_id_duplicate", "two clipboard images share an `Id`";
    ImageMimeInvalid => "validation.image_mime_invalid", "a clipboard image's `MimeType` is absent or not `image/*`";
    ImageBase64Invalid => "validation.image_base64_invalid", "`DataBase64` is absent, empty or not valid base64";
    RagScopeKeyMissing => "validation.rag_scope_key_missing", "a `RagScope` condition has no `Key`";
    RagScopeOperatorInvalid => "validation.rag_scope_operator_invalid", "a `RagScope` operator is not `==`, `!=`, `contains` or `does_not_contain`";
    RagScopeValuesEmpty => "validation.rag_scope_values_empty", "a `RagScope` condition has no values";
    ContextIdInvalid => "validation.context_id_invalid", "`AgentContextId` / `ConversationContextId` is empty or malformed";
    FollowUpInvalid => "validation.follow_up_invalid", "`FollowUp` is not `enqueue`, `reject`, `interrupt` or `steer`, or it is `steer` on a turn that carries more than an `Instruction`";
    LimitExceeded => "validation.limit_exceeded", "a size or count limit was exceeded; the message names the limit";
    UnknownAgentContext => "context.unknown_agent_context", "`AgentContextId` names no configured agent context";
    UnknownConversationContext => "context.unknown_conversation_context", "`ConversationContextId` names no configured conversation context";
    FollowUpNotAllowed => "context.follow_up_not_allowed", "the turn's ConversationContext does not let a request choose this `FollowUp` (its `follow_up_allowed`); nothing was stored";
    TurnConflict => "turn.conflict", "the `(SessionId, TurnId)` pair was already used with different content";
    TurnNotFound => "turn.not_found", "a tool continuation or a cancel names a turn that does not exist in this session";
    TurnFinished => "turn.finished", "a cancel names a turn that already ended; nothing changed";
    TurnSteered => "turn.steered", "a warning on the reply of a follow-up that steered another turn (`FollowUp: steer`): its instruction was added to that turn, and the reply is that turn's ending";
    TurnCancelled => "turn.cancelled", "the turn was cancelled (`turn.cancel`) before it ended; the reply keeps what the model had streamed";
    TurnNotAwaitingToolResults => "turn.not_awaiting_tool_results", "a tool continuation names a turn that is not waiting for tool results";
    TurnNotAwaitingApproval => "turn.not_awaiting_approval", "a Tool Approval Submission names a turn that is not waiting for approval (it never asked, or it was answered already with other decisions)";
    SessionBusy => "session.busy", "the session is busy with another turn and the turn rejects follow-ups (its `FollowUp`, or its ConversationContext's `follow_up = \"reject\"`); nothing was stored";
    SessionQueueFull => "session.queue_full", "the session already has 256 turns waiting behind its active turn (queued, or steering it; `MAX_QUEUED_PER_SESSION`); nothing was stored";
    SessionAwaitingToolResults => "session.awaiting_tool_results", "a new user turn that neither interrupts nor steers arrived while the session waits for tool results";
    SessionAwaitingApproval => "session.awaiting_approval", "a new user turn that neither interrupts nor steers arrived while the session waits for the client's approval of tool calls";
    SessionUnavailable => "session.unavailable", "the `SessionId` belongs to another tenant; choose another (nothing about that session is stored, read or revealed)";
    SessionContextFixed => "session.context_fixed", "a later turn names another `AgentContextId` than the session was created with (the `ConversationContextId` may change per turn)";
    LimitTurnsInFlight => "limit.turns_in_flight", "the tenant has as many turns in flight as `turns_in_flight` allows";
    LimitTurnsPerMinute => "limit.turns_per_minute", "the tenant reached `turns_per_minute` in the last 60 seconds";
    LimitSessionsPerMinute => "limit.sessions_per_minute", "the tenant created `sessions_per_minute` sessions in the last 60 seconds";
    LimitTokensPerMinute => "limit.tokens_per_minute", "the tenant's turns used `tokens_per_minute` LLM tokens in the last 60 seconds";
    LimitBudgetExhausted => "limit.budget_exhausted", "a call of the turn would pass its tenant's or its ConversationContext's spend budget (`usd_per_day`, `usd_per_month`); the turn was refused, or failed before that call";
    LimitResumesPerMinute => "limit.resumes_per_minute", "the session was resumed `pipeline.resumes_per_minute` times in the last 60 seconds (`turn.resume`); nothing was sent again";
    ToolResultsTurnCancelled => "tool_results.turn_cancelled", "tool results name a turn that was cancelled; they were not used";
    ToolsServerRoundsExceeded => "tools.server_rounds_exceeded", "the model called server tools in more round trips of one turn than the context's `server_tools.max_rounds`; the turn failed";
    ToolResultsMismatch => "tool_results.mismatch", "tool results do not match the pending tool calls in count, ids and order; the turn is aborted";
    ToolApprovalsMismatch => "tool_approvals.mismatch", "decisions do not match the calls awaiting approval in count, ids and order; the turn is aborted";
    ToolApprovalsExpired => "tool_approvals.expired", "decisions came after the approval request expired; its calls were denied and the turn ran on without them";
    LlmRefused => "llm.refused", "the model refused to answer";
    LlmFailed => "llm.failed", "the provider reported the response as failed";
    LlmRejected => "llm.rejected", "the provider rejected the request (a non-retryable 4xx)";
    LlmUnavailable => "llm.unavailable", "the provider stayed unavailable through every retry";
    LlmTimeout => "llm.timeout", "the provider did not answer within the configured timeouts";
    LlmInvalidResponse => "llm.invalid_response", "the provider's answer could not be understood";
    RetriesExhausted => "internal.retries_exhausted", "a dependency stayed unavailable through every retry; the turn was dead-lettered";
    Internal => "internal.error", "an unexpected server error; operators have the details in the logs";
    Undeliverable => "internal.undeliverable", "a message of this turn could not be handed on (larger than the broker accepts, or its data unusable); the turn was dead-lettered";
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = String::deserialize(d)?;
        ErrorCode::parse(&code)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error code `{code}`")))
    }
}

impl JsonSchema for ErrorCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        schemars::json_schema!({ "type": "string", "enum": codes })
    }
}

/// One entry of `InvokeResult.Errors` / `InvokeResult.Warnings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ApiError {
    /// Stable dotted code.
    pub code: ErrorCode,
    /// Human-readable explanation, specific to this occurrence.
    pub message: String,
    /// JSON path of the offending property, when there is one (e.g. `InputArtifacts[2].RelativePath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// An error about the request as a whole.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: no_nul(message.into()), field: None }
    }

    /// An error about one property.
    pub fn at(code: ErrorCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { code, message: no_nul(message.into()), field: Some(no_nul(field.into())) }
    }
}

/// `text` with each NUL written `\0`. Errors quote what a client sent (a property's name, a
/// `reply_to`), and every reply is stored as `jsonb`, which cannot hold NUL: the store would
/// refuse the refusal itself.
fn no_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\\0")
    } else {
        text
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} at {}: {}", self.code, field, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_dotted_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(s.contains('.'), "{s} is not dotted");
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_'),
                "{s}"
            );
            assert_eq!(ErrorCode::parse(s), Some(*code));
        }
    }
}
