//! Assembly: `(session state, conversation context, validated turn, retrieved chunks)` in,
//! `(/responses request body, record of what was sent, state update)` out. Pure: no I/O, no
//! clock (the caller passes `now`).
//!
//! - [`render_context_block`]: the AGN-002 `[CONTEXT]` block, byte for byte.
//! - [`assemble`]: the AGN-003 request as corrected by DESIGN.md §5, with the Session
//!   Architecture's delta policy: chunks and unchanged files the chain already holds are not
//!   resent, files over the limit are skipped, a new chain starts when the last response is
//!   missing, expired or lost, and a new chain is rehydrated from stored history.
//! - [`SessionState`]: what the pipeline stores per session between turns, changed only by
//!   [`SessionState::apply_answer`] and [`SessionState::force_new_chain`].
//! - [`check_tool_results`]: the AGN-033 exact-match rule for tool results.
//!
//! Flow for one call: `assemble` → send `body` → on `previous_response_not_found`,
//! `state.force_new_chain()` and `assemble` again → on an answer,
//! `state.apply_answer(&assembled.update, &answer, &policy)`; store `assembled.record` with the
//! response record and put its `user_warnings` on the turn's final response.

mod block;
mod body;
mod chain;
mod continuation;
mod files;
mod history;
mod message;
mod packed;
mod record;
mod rehydrate;
mod state;
mod stored;
mod stored_file;
mod tools;
mod user_turn;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::config::AssemblePolicy;
pub use block::{render_context_block, CONTEXT_HEADER};
pub use chain::{plan_chain, unsent_chunks, ChainPlan};
pub use history::{Cost, History, Kept, TranscriptEntry};
pub use packed::{ChunkRef, FileRef, PackedState, PackedText};
pub use record::{
    ChainReason, ChainRecord, ChainStatus, RehydrationRecord, SentChunk, SentFile, SentRecord,
    SentToolOutput, SkipReason, SkippedFile, TurnKind, WARN_FILE_BINARY, WARN_FILE_TOO_LARGE,
    WARN_HISTORY_TRUNCATED,
};
pub use state::{
    AnswerOutcome, ChainState, FileHash, OpenTurn, ProviderAnswer, SessionState, SessionStateOf,
    StateUpdate, StoredFile,
};
pub use stored::StoredState;
pub use tools::{check_tool_results, ToolResultsMismatch};
pub(crate) use user_turn::sha256_hex;

use crate::chunk::Chunk;
use crate::config::ConversationContext;
use crate::contracts::{ApiError, ErrorCode, Steer, ToolCall, ToolContinuation, UserTurn};

/// Everything one request is assembled from.
#[derive(Debug, Clone, Copy)]
pub struct AssembleInput<'a> {
    /// The session's state before this request.
    pub state: &'a SessionState,
    /// The reasoning profile serving the turn.
    pub context: &'a ConversationContext,
    /// The delta policy knobs.
    pub policy: &'a AssemblePolicy,
    /// The current time, for the retention check.
    pub now: DateTime<Utc>,
    /// The turn.
    pub turn: TurnInput<'a>,
    /// The function tools of the context's MCP servers, as listed for this request
    /// (`crate::mcp`), offered after the client tools and the built-ins.
    pub mcp_tools: &'a [serde_json::Value],
}

/// The turn being assembled.
#[derive(Debug, Clone, Copy)]
pub enum TurnInput<'a> {
    /// A User Turn Request with the chunks retrieved for it (in retrieval order).
    User {
        /// The validated turn.
        turn: &'a UserTurn,
        /// Retrieved chunks; those the chain already holds are dropped here.
        chunks: &'a [Chunk],
    },
    /// A Tool Continuation Submission.
    ToolContinuation {
        /// The validated submission.
        continuation: &'a ToolContinuation,
        /// The calls the turn is waiting on, in the order they were emitted.
        pending: &'a [ToolCall],
        /// The turn's streaming preference (a continuation carries none of its own).
        stream: bool,
        /// Follow-ups that steer the turn: their instructions follow the results.
        steers: &'a [Steer],
    },
}

/// The assembled request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assembled {
    /// The `/responses` request body, serialised once here and carried as its text.
    pub body: crate::llm::RequestBody,
    /// What was sent and why, for the immutable response record.
    pub record: SentRecord,
    /// How the session changes once the provider has answered this request.
    pub update: StateUpdate,
}

impl Assembled {
    /// The chunks retrieved for this request, with text, from what it kept: those it sent, then
    /// those the chain already held, their text taken from the session `state`'s history. Used
    /// to assemble the turn again on a new chain (a lost chain, reprocessing), so the chunks
    /// need not travel or be stored a second time. Chunks the turn's files superseded are left
    /// out: the same files supersede them again.
    pub fn retrieved_chunks(&self, state: &SessionState) -> Vec<crate::chunk::Chunk> {
        let mut chunks = self.update.chunks.clone();
        for held in &self.record.chunks_already_sent {
            if let Some(c) = state.history.chunks.iter().find(|c| c.id == held.id) {
                chunks.push(c.clone());
            }
        }
        chunks
    }
}

/// Why a request could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// The tool results do not answer the pending calls exactly.
    #[error(transparent)]
    ToolResultsMismatch(#[from] ToolResultsMismatch),
}

impl AssembleError {
    /// The stable error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            AssembleError::ToolResultsMismatch(_) => ErrorCode::ToolResultsMismatch,
        }
    }

    /// The `InvokeResult` error for the client.
    pub fn to_api_error(&self) -> ApiError {
        match self {
            AssembleError::ToolResultsMismatch(m) => m.to_api_error(),
        }
    }
}

/// Assembles the `/responses` request for one turn.
pub fn assemble(input: AssembleInput<'_>) -> Result<Assembled, AssembleError> {
    match input.turn {
        TurnInput::User { turn, chunks } => Ok(user_turn::assemble_user_turn(&input, turn, chunks)),
        TurnInput::ToolContinuation { continuation, pending, stream, steers } => {
            let call = continuation::Round { continuation, pending, stream, steers };
            continuation::assemble_tool_continuation(&input, &call)
        }
    }
}
