//! The turn as it travels: the admitted turn ([`AdmittedTurn`]), with its chunks ([`RetrievedTurn`]),
//! with its `/responses` body ([`AssembledTurn`]), and how its round trip ended ([`EndedRoundTrip`]).
//!
//! Requests travel whole: they were validated once and fit in a message, and re-reading them
//! from PostgreSQL at every hop would cost more than carrying them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DecodeError;
use crate::assemble::{
    assemble, AssembleInput, AssemblePolicy, Assembled, SessionState, StoredState, TurnInput,
};
use crate::chunk::Chunk;
use crate::config::ConversationContext;
use crate::contracts::{
    ApiError, ErrorCode, InstanceName, Outcome, ReplyAddress, Steer, TenantName, ToolCall, TurnKey,
    Usage, UserTurn, UserWarning, ValidatedRequest,
};
use crate::llm::RequestBody;

/// One round trip of a turn: the user turn, and the continuation that resumed it, if any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmittedTurn {
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
    /// The backend instance this round trip's replies and deltas go to, when the submission
    /// that started it asked for one (`reply_to`); otherwise the session's reply queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<InstanceName>,
    /// The session's tenant (absent in a single-tenant deployment, and in messages queued
    /// before tenants existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantName>,
    /// Calls of the last answer that the pipeline runs itself before this round trip's
    /// provider call (retrieve runs them; their results join the continuation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_calls: Vec<ToolCall>,
    /// Every server tool execution of this turn so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executed: Vec<super::ServerExecution>,
    /// Follow-ups that steer this turn whose instructions this round trip's request adds after
    /// the tool results (read by assemble; a continuation only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steers: Vec<Steer>,
}

impl AdmittedTurn {
    /// Where this round trip's replies go.
    pub fn address(&self) -> ReplyAddress {
        ReplyAddress { tenant: self.tenant.clone(), instance: self.reply_to.clone() }
    }

    /// The user turn that opened the turn (a stored turn always is one).
    pub fn user_turn(&self) -> Result<&UserTurn, ApiError> {
        match &self.turn {
            ValidatedRequest::UserTurn(t) => Ok(t),
            ValidatedRequest::ToolContinuation(_) => {
                Err(ApiError::new(ErrorCode::Internal, "the stored turn is not a user turn"))
            }
        }
    }
}

impl AdmittedTurn {
    /// Builds this round trip's `/responses` request from the session's `state` (used by the
    /// assemble stage, and by invoke to rebuild a chain the provider lost), offering
    /// `mcp_tools` too.
    pub fn assemble(
        &self,
        chunks: &[Chunk],
        state: &SessionState,
        (context, mcp_tools): (&ConversationContext, &[serde_json::Value]),
        policy: &AssemblePolicy,
    ) -> Result<Assembled, ApiError> {
        let turn = self.user_turn()?;
        let turn_input = match &self.continuation {
            Some(ValidatedRequest::ToolContinuation(c)) => TurnInput::ToolContinuation {
                continuation: c,
                pending: &self.pending_tool_calls,
                stream: turn.stream(),
                steers: &self.steers,
            },
            _ => TurnInput::User { turn, chunks },
        };
        let now = Utc::now();
        let input = AssembleInput { state, context, policy, now, turn: turn_input, mcp_tools };
        assemble(input).map_err(|e| e.to_api_error())
    }
}

/// The turn with what retrieval found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedTurn {
    /// The turn (`job` on the wire, as queued messages and saved answers have it).
    #[serde(rename = "job")]
    pub admitted: AdmittedTurn,
    /// Chunks, best first.
    pub chunks: Vec<Chunk>,
    /// Warnings for the final response (ignored scope keys, retrieval unavailable).
    pub warnings: Vec<UserWarning>,
}

/// The turn with its `/responses` request. The retrieved chunks do not travel again: a lost
/// chain is rebuilt from what `assembled` kept ([`Assembled::retrieved_chunks`]); the `chunks`
/// of messages queued by earlier builds are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssembledTurn {
    /// The turn (`job` on the wire, as queued messages and saved answers have it).
    #[serde(rename = "job")]
    pub admitted: AdmittedTurn,
    /// Warnings so far.
    pub warnings: Vec<UserWarning>,
    /// The request body and the record of what it sends.
    pub assembled: Assembled,
    /// The session state `assembled` was built from, as stored, for persist to build the next
    /// one from (absent in messages queued by earlier builds: persist reads the row then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_state: Option<StoredState>,
}

/// How a round trip ended, for the persist stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndedRoundTrip {
    /// The turn (`job` on the wire, as queued messages and saved answers have it).
    #[serde(rename = "job")]
    pub admitted: AdmittedTurn,
    /// What was sent, when a request was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assembled: Option<Assembled>,
    /// Warnings for a final response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<UserWarning>,
    /// The provider's answer or the reason there is none.
    pub result: RoundTrip,
    /// The session state the request was assembled from, carried from the invoke message; never
    /// saved with an answer (a saved answer outlives the state it was read from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_state: Option<StoredState>,
    /// The stages it passed, from its delivery's headers (not part of the body).
    #[serde(skip)]
    pub hops: Vec<super::Hop>,
}

impl EndedRoundTrip {
    /// A round trip that ends the turn with `errors`.
    pub fn failed(job: AdmittedTurn, errors: Vec<ApiError>) -> Self {
        EndedRoundTrip {
            admitted: job,
            assembled: None,
            warnings: Vec::new(),
            result: RoundTrip::Failed { errors, raw: None },
            session_state: None,
            hops: Vec::new(),
        }
    }

    /// The same round trip ended as cancelled instead (a cancel was admitted while it ran),
    /// keeping the text the model had produced.
    pub fn into_cancelled(mut self) -> Self {
        self.result = match self.result {
            RoundTrip::Answered(a) => {
                let streamed = match &a.outcome {
                    Outcome::Final(f) => f.primary_output_text.clone(),
                    Outcome::ClientToolContinuation(_) | Outcome::ToolApprovalRequired(_) => {
                        String::new()
                    }
                };
                RoundTrip::Cancelled { streamed, answered: Some(Box::new(a)), estimate: None }
            }
            RoundTrip::Failed { .. } => {
                RoundTrip::Cancelled { streamed: String::new(), answered: None, estimate: None }
            }
            cancelled @ RoundTrip::Cancelled { .. } => cancelled,
        };
        self
    }
}

/// A final answer with the warnings the turn owes (`owed`) before the provider's own; a tool
/// continuation unchanged. Shared by the persist stage and reprocessing, which must shape answers alike.
pub fn with_owed_warnings(outcome: Outcome, owed: &[UserWarning]) -> Outcome {
    match outcome {
        Outcome::Final(mut f) => {
            let mut warnings = owed.to_vec();
            warnings.append(&mut f.user_warnings);
            f.user_warnings = warnings;
            Outcome::Final(f)
        }
        other => other,
    }
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
    /// The client cancelled the turn (`turn.cancel`) while it ran.
    Cancelled {
        /// The output text the model had streamed by then.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        streamed: String,
        /// The provider's answer, when it had answered before the cancel took effect: its
        /// tokens were spent, so they are recorded and charged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered: Option<Box<Answer>>,
        /// An estimate of what an aborted call spent (no answer reported it), recorded and
        /// charged in its place.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimate: Option<crate::contracts::Usage>,
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
        Answer {
            response_id: r.response_id,
            created_at,
            outcome: r.outcome,
            usage: r.usage,
            raw: r.raw,
        }
    }
}

/// A provider answer kept at rest (`llm_results`), versioned: rows written before versioning
/// hold a bare [`EndedRoundTrip`] and still read.
///
/// From version 2 on, the `/responses` body is left out (`null`) unless invoke rebuilt it: the
/// invoke message that a redelivery brings back carries it, and the record keeps it
/// (`request_payload`). It was a third copy of the largest part of a turn.
///
/// Read with [`SavedRoundTrip::read`], not `Deserialize`: see there.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SavedRoundTrip {
    /// Written from version 1 on: `{"v": 2, "job": {..}}` (or `"v": 1`).
    Current {
        /// Format version: 1 (with the body) or 2 (the body only when rebuilt).
        v: u16,
        /// The round trip.
        job: EndedRoundTrip,
    },
    /// A bare `EndedRoundTrip`, as written before versioning.
    Legacy(EndedRoundTrip),
}

impl SavedRoundTrip {
    /// The format written now.
    pub const VERSION: u16 = 2;

    /// `job`, in the current format: without its body unless `rebuilt` (the body is not the one
    /// the invoke message carries).
    pub fn encode(job: &mut EndedRoundTrip, rebuilt: bool) -> Result<Value, serde_json::Error> {
        #[derive(Serialize)]
        struct Current<'a> {
            v: u16,
            job: &'a EndedRoundTrip,
        }
        crate::metrics::metrics().json("serialize", "saved_answer");
        let body = match job.assembled.as_mut() {
            Some(a) if !rebuilt => std::mem::take(&mut a.body),
            _ => RequestBody::null(),
        };
        let state = job.session_state.take();
        let saved = serde_json::to_value(Current { v: Self::VERSION, job });
        if let Some(a) = job.assembled.as_mut().filter(|_| !body.is_null()) {
            a.body = body;
        }
        job.session_state = state;
        saved
    }

    /// A saved answer as stored, in any format this build reads; a body left out is `null`
    /// (see [`SavedRoundTrip::with_body`]).
    pub fn read(stored: Value) -> Result<EndedRoundTrip, DecodeError> {
        /// The versioned form, read without the enum: an untagged enum buffers what it reads,
        /// and the body inside (text, not a tree) reads only from `serde_json`'s own types.
        #[derive(Deserialize)]
        struct Versioned {
            v: u16,
            job: EndedRoundTrip,
        }
        crate::metrics::metrics().json("parse", "saved_answer");
        let saved = if stored.get("v").is_some() {
            let Versioned { v, job } = serde_json::from_value(stored)?;
            SavedRoundTrip::Current { v, job }
        } else {
            SavedRoundTrip::Legacy(serde_json::from_value(stored)?)
        };
        saved.into_job()
    }

    /// `job` with the body it was saved without: `sent`, the invoke message's own; and the
    /// session state that message carries.
    pub fn with_body(mut job: EndedRoundTrip, sent: AssembledTurn) -> EndedRoundTrip {
        if let Some(a) = job.assembled.as_mut().filter(|a| a.body.is_null()) {
            a.body = sent.assembled.body;
        }
        job.session_state = sent.session_state;
        job
    }

    /// `first`, the answer saved first, in place of `ours`, another call's answer to the same
    /// round trip that was not kept: with the session state `ours` carries and, where `first`
    /// was saved without its body, the body the invoke message sent (`sent`, or the one
    /// `ours` carries when it was not rebuilt).
    pub fn in_place_of(
        mut first: EndedRoundTrip,
        ours: EndedRoundTrip,
        sent: Option<RequestBody>,
    ) -> EndedRoundTrip {
        let body = sent.or(ours.assembled.map(|a| a.body));
        if let (Some(a), Some(body)) = (first.assembled.as_mut().filter(|a| a.body.is_null()), body)
        {
            a.body = body;
        }
        first.session_state = ours.session_state;
        first
    }

    /// The round trip, if this build reads its version.
    pub fn into_job(self) -> Result<EndedRoundTrip, DecodeError> {
        match self {
            SavedRoundTrip::Current { v: 1 | Self::VERSION, job } | SavedRoundTrip::Legacy(job) => {
                Ok(job)
            }
            SavedRoundTrip::Current { v, .. } => {
                Err(DecodeError::Version { what: "saved answer", version: v })
            }
        }
    }
}
