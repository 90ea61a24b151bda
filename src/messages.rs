//! Every message that crosses a queue edge between stages, in one place. Each is tagged with
//! its kind and version (`"Kind": "turn.assemble/v1"`); a consumer rejects kinds it does not
//! know, so a rolling upgrade can never feed a stage a shape it misreads.
//!
//! Edges: backends → `requests` (raw `AgentExecuteRequest` JSON) → validate → `retrieve`
//! ([`TurnJob`]) → `assemble` ([`AssembleJob`]) → `invoke` ([`InvokeJob`]) → `persist`
//! ([`PersistJob`]) → the session's reply queue (`InvokeResult<AgentExecuteResponse>`).
//!
//! Requests travel whole: they were validated once and fit in a message, and re-reading them
//! from PostgreSQL at every hop would cost more than carrying them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::assemble::Assembled;
use crate::chunk::Chunk;
use crate::contracts::{ApiError, Outcome, ToolCall, TurnKey, Usage, UserWarning, ValidatedRequest};

/// A message between stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "Kind")]
pub enum StageMessage {
    /// validate → retrieve: an admitted turn (or a resumed one, for a tool continuation).
    #[serde(rename = "turn.retrieve/v1")]
    Retrieve(TurnJob),
    /// retrieve → assemble: the turn with its retrieved chunks.
    #[serde(rename = "turn.assemble/v1")]
    Assemble(AssembleJob),
    /// assemble → invoke: the turn with its `/responses` body.
    #[serde(rename = "turn.invoke/v1")]
    Invoke(InvokeJob),
    /// any stage → persist: how the round trip ended.
    #[serde(rename = "turn.persist/v1")]
    Persist(PersistJob),
}

impl StageMessage {
    /// The turn the message belongs to.
    pub fn key(&self) -> &TurnKey {
        &self.job().key
    }

    /// The turn job inside.
    pub fn job(&self) -> &TurnJob {
        match self {
            StageMessage::Retrieve(j) => j,
            StageMessage::Assemble(a) => &a.job,
            StageMessage::Invoke(i) => &i.job,
            StageMessage::Persist(p) => &p.job,
        }
    }
}

/// One round trip of a turn: the user turn, and the continuation that resumed it, if any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnJob {
    /// The turn.
    pub key: TurnKey,
    /// Which round trip: 0 for the user turn, +1 per tool continuation.
    pub step: i32,
    /// The User Turn Request that opened the turn.
    pub turn: ValidatedRequest,
    /// The Tool Continuation Submission this round trip answers, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<ValidatedRequest>,
    /// The calls the continuation answers, in emitted order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_tool_calls: Vec<ToolCall>,
    /// When the turn was admitted, for latency figures.
    pub admitted_at: DateTime<Utc>,
    /// Warnings of earlier round trips of this turn, owed to its final response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carried_warnings: Vec<UserWarning>,
}

/// The turn with what retrieval found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssembleJob {
    /// The turn.
    pub job: TurnJob,
    /// Chunks, best first.
    pub chunks: Vec<Chunk>,
    /// Warnings for the final response (ignored scope keys, retrieval unavailable).
    pub warnings: Vec<UserWarning>,
}

/// The turn with its `/responses` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvokeJob {
    /// The turn.
    pub job: TurnJob,
    /// The chunks it was assembled from (needed to rebuild a lost chain).
    pub chunks: Vec<Chunk>,
    /// Warnings so far.
    pub warnings: Vec<UserWarning>,
    /// The request body and the record of what it sends.
    pub assembled: Assembled,
}

/// How a round trip ended, for the persist stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistJob {
    /// The turn.
    pub job: TurnJob,
    /// What was sent, when a request was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assembled: Option<Assembled>,
    /// Warnings for a final response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<UserWarning>,
    /// The provider's answer or the reason there is none.
    pub result: RoundTrip,
}

/// The result of calling the provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "Status", rename_all = "snake_case")]
pub enum RoundTrip {
    /// The provider answered.
    Answered(Answer),
    /// The turn fails with these errors.
    Failed {
        /// What the client is told.
        errors: Vec<ApiError>,
        /// The provider's error body, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw: Option<Value>,
    },
}

/// A provider answer, mapped to AGN-033.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The provider response id.
    pub response_id: String,
    /// When the provider created it.
    pub created_at: DateTime<Utc>,
    /// Final answer or tool calls.
    pub outcome: Outcome,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The raw provider response, stored unchanged.
    pub raw: Value,
}

impl From<crate::llm::LlmResponse> for Answer {
    /// The answer as the pipeline keeps it (the provider's creation time, else now).
    fn from(r: crate::llm::LlmResponse) -> Self {
        use chrono::TimeZone as _;
        let created_at = r
            .raw
            .get("created_at")
            .and_then(Value::as_i64)
            .and_then(|secs| Utc.timestamp_opt(secs, 0).single())
            .unwrap_or_else(Utc::now);
        Answer { response_id: r.response_id, created_at, outcome: r.outcome, usage: r.usage, raw: r.raw }
    }
}
