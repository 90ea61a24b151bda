//! The record of what one `/responses` request sent (Session Architecture §2.2, §7.2, §10.2):
//! chunk ids with path and lines, files with hashes, skipped files, the chain decision and why,
//! and the user warnings the final response must carry. Stored with the immutable response
//! record, so every field is plain data.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::contracts::UserWarning;

/// Warning code: an active file was over the size limit and not sent.
pub const WARN_FILE_TOO_LARGE: &str = "files.skipped_too_large";
/// Warning code: an active file is not text and was not sent.
pub const WARN_FILE_BINARY: &str = "files.skipped_binary";
/// Warning code: a new chain was rehydrated without some of the older history.
pub const WARN_HISTORY_TRUNCATED: &str = "session.history_truncated";

/// What one request sent, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentRecord {
    /// The turn the request belongs to.
    pub turn_id: String,
    /// A user turn or a tool continuation.
    pub kind: TurnKind,
    /// Whether the request continued the provider chain, started one, or rehydrated one.
    pub chain: ChainRecord,
    /// Chunks sent, in the order they appear in the request.
    pub chunks: Vec<SentChunk>,
    /// Chunks retrieved for this turn but not sent: the chain already has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks_already_sent: Vec<SentChunk>,
    /// Retrieved chunks left out because the model has the file itself: this turn's active
    /// file, or the version an earlier turn sent and the chain still holds (local edits win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks_superseded: Vec<SentChunk>,
    /// Active files sent (whole), with the SHA-256 of what was sent.
    pub files: Vec<SentFile>,
    /// Active files of this turn not sent because the chain has this exact version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_unchanged: Vec<SentFile>,
    /// Active files not sent at all, and why.
    pub skipped_files: Vec<SkippedFile>,
    /// Whether the latched solution context was sent.
    pub solution_context_sent: bool,
    /// Ids of the clipboard images sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// Tool outputs sent (tool continuations, or calls abandoned by an aborted turn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_outputs: Vec<SentToolOutput>,
    /// What a new chain was rehydrated with, and what was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehydration: Option<RehydrationRecord>,
    /// Warnings for the turn's final response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_warnings: Vec<UserWarning>,
    /// The mode the turn ran in, when it differs from the one the continued chain followed: the
    /// request carried the new ConversationContext's boot prompt as a developer message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_changed_to: Option<String>,
    /// Follow-ups that steer the turn whose instructions the request added, as user messages
    /// after the tool results, in the order they were admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steered_by: Vec<String>,
}

/// Which AGN-034 scenario produced the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnKind {
    /// A User Turn Request.
    UserTurn,
    /// A Tool Continuation Submission.
    ToolContinuation,
}

/// The chain decision for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRecord {
    /// New, continued or rehydrated.
    pub status: ChainStatus,
    /// Why.
    #[serde(flatten)]
    pub reason: ChainReason,
}

/// Whether the request continued the provider chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainStatus {
    /// First call of a session: a new chain with nothing to restore.
    New,
    /// Sent with `previous_response_id`: only the deltas.
    Continued,
    /// A new chain preloaded from stored history.
    Rehydrated,
}

/// Why the chain was continued or (re)started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ChainReason {
    /// The previous response is within the provider's retention.
    PreviousResponseFresh {
        /// Sent as `previous_response_id`.
        previous_response_id: String,
        /// When the provider created it.
        responded_at: DateTime<Utc>,
    },
    /// The session has no response to chain onto.
    NoPreviousResponse,
    /// The previous response is older than the provider's retention.
    PreviousResponseExpired {
        /// The response that can no longer be chained onto.
        previous_response_id: String,
        /// When the provider created it.
        responded_at: DateTime<Utc>,
        /// When it passed the configured retention.
        expired_at: DateTime<Utc>,
    },
    /// The provider answered `previous_response_not_found` for it.
    PreviousResponseNotFound {
        /// The response the provider no longer knows.
        previous_response_id: String,
    },
}

/// A chunk as recorded: identity and span, not text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentChunk {
    /// Chunk id (the vector store point's `chunk_id`).
    pub id: String,
    /// Relative path.
    pub path: String,
    /// First line.
    pub start_line: u32,
    /// Last line.
    pub end_line: u32,
    /// Restored from history into a new chain rather than retrieved for this turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rehydrated: bool,
}

impl SentChunk {
    /// The record entry of `chunk`.
    pub fn of(chunk: &crate::chunk::Chunk, rehydrated: bool) -> Self {
        SentChunk {
            id: chunk.id.clone(),
            path: chunk.path.clone(),
            start_line: chunk.start_line,
            end_line: chunk.end_line,
            rehydrated,
        }
    }
}

/// An active file as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentFile {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256 (hex) of the contents.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Restored from history into a new chain rather than supplied with this turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rehydrated: bool,
}

/// An active file that was not sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256 (hex) of the contents.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Why it was not sent.
    #[serde(flatten)]
    pub reason: SkipReason,
}

/// Why an active file was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SkipReason {
    /// Larger than `assemble.active_file_max_bytes`.
    TooLarge {
        /// The limit in force.
        limit_bytes: u64,
    },
    /// The contents are not UTF-8 text, so they cannot be shown as a chunk.
    Binary,
}

/// A `function_call_output` item as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentToolOutput {
    /// The provider's call id.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// Whether the output reports a failure.
    pub failed: bool,
}

/// What a new chain was preloaded with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RehydrationRecord {
    /// Earlier turns restored in the transcript.
    pub transcript_turns: usize,
    /// Earlier turns left out (over the budget, now or when stored).
    pub transcript_turns_cut: u64,
    /// Whether the newest restored turn had to be shortened to fit the budget.
    pub transcript_truncated: bool,
    /// Earlier chunks left out.
    pub chunks_cut: u64,
    /// Earlier active files left out, by path.
    pub files_cut: Vec<String>,
}

impl RehydrationRecord {
    /// Whether anything was left out.
    pub fn cut_anything(&self) -> bool {
        self.transcript_turns_cut > 0
            || self.transcript_truncated
            || self.chunks_cut > 0
            || !self.files_cut.is_empty()
    }
}
