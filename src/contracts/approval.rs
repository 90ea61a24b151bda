//! Approval gates on the wire (client protocol v3, docs/tools.md "Approvals"): the reply that
//! asks for approval (`Kind` = `tool_approval_required`) and the client's decision on each call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::response::ToolCall;

/// The longest `Message` a denial may carry, in characters: the model reads it.
pub const MAX_DENIAL_MESSAGE_CHARS: usize = 2_000;

/// Buckets of a `tool_approval_required` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields, try_from = "ApprovalShape")]
pub struct ToolApprovalOutput {
    /// The server tool calls that wait for the client's decision, in the order the client
    /// answers them (one or more).
    tool_calls: Vec<ToolCall>,
    /// When the request expires (RFC 3339, UTC): calls not decided by then are denied.
    approval_expires_at: String,
    /// Informational text the model wrote with the calls; never actionable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_continuation_message: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct ApprovalShape {
    /// The server tool calls that wait for the client's decision, in order (one or more).
    #[schemars(length(min = 1))]
    tool_calls: Vec<ToolCall>,
    /// When the request expires (RFC 3339, UTC): calls not decided by then are denied.
    approval_expires_at: String,
    /// Informational text; never actionable.
    #[serde(default)]
    tool_continuation_message: Option<String>,
}

impl TryFrom<ApprovalShape> for ToolApprovalOutput {
    type Error = &'static str;

    fn try_from(s: ApprovalShape) -> Result<Self, Self::Error> {
        let expires = chrono::DateTime::parse_from_rfc3339(&s.approval_expires_at)
            .map_err(|_| "ApprovalExpiresAt must be an RFC 3339 time")?;
        ToolApprovalOutput::new(s.tool_calls, expires.into(), s.tool_continuation_message)
            .ok_or("ToolCalls must hold at least one call")
    }
}

impl ToolApprovalOutput {
    /// The bucket set; `None` when `tool_calls` is empty.
    pub fn new(
        tool_calls: Vec<ToolCall>,
        expires_at: chrono::DateTime<chrono::Utc>,
        message: Option<String>,
    ) -> Option<Self> {
        let approval_expires_at = expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        (!tool_calls.is_empty()).then_some(ToolApprovalOutput {
            tool_calls,
            approval_expires_at,
            tool_continuation_message: message,
        })
    }

    /// The calls awaiting a decision, in the order the client answers them.
    pub fn tool_calls(&self) -> &[ToolCall] {
        &self.tool_calls
    }

    /// When the request expires, as sent.
    pub fn expires_at(&self) -> &str {
        &self.approval_expires_at
    }
}

/// The client's decision on one call awaiting approval (validated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ToolApproval {
    /// The call decided on.
    pub tool_call_id: String,
    /// Run it (`true`) or not.
    pub approved: bool,
    /// On a denial only: what the model is told, besides that the user denied the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ToolApproval {
    /// What the model is told of a denied call.
    pub fn denial(&self) -> String {
        match &self.message {
            Some(m) => format!("the user denied this call: {m}"),
            None => "the user denied this call".to_owned(),
        }
    }
}

/// One entry of `ToolApprovals[]` as sent (every property optional, so a missing one gets a
/// specific error).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ToolApprovalWire {
    /// The `ToolCallId` of the call decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `true`: run the call; `false`: do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// On a denial only: a message the model sees (at most 2,000 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
