//! Per-session assembly state, stored by the pipeline as JSONB: the provider chain and what it
//! already holds (chunk ids, file hashes, solution context), the latched solution context, the
//! turn waiting for tool results, and the bounded history a new chain is rehydrated from.
//!
//! The state only changes through pure functions: [`SessionState::apply_answer`] after the
//! provider answered, and [`SessionState::force_new_chain`] after it said
//! `previous_response_not_found`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::history::{History, Kept};
use super::record::{ChainReason, TurnKind};
pub use super::stored_file::StoredFile;
use crate::chunk::Chunk;
use crate::config::AssemblePolicy;
use crate::contracts::ToolCall;

/// Most chunk ids remembered per chain. Forgetting the oldest only means a chunk retrieved
/// again is sent again, which is harmless, while an unbounded list would grow for 30 days.
const CHAIN_CHUNK_ID_CAP: usize = 4096;
/// Most files remembered per chain, likewise: a file forgotten is only sent again if it comes
/// again unchanged, while a session sending new paths turn after turn would grow the list.
const CHAIN_FILE_CAP: usize = 1024;
/// Most characters an open turn's instruction grows to with the follow-ups that steered it
/// (twice the default `limits.max_instruction_chars`): the state is rewritten every round trip
/// and a new chain restates it, so a turn steered round trip after round trip must not grow it
/// without bound. What does not fit is cut (noted where the note fits) and was sent on the
/// chain it steered.
const OPEN_INSTRUCTION_MAX_CHARS: usize = 400_000;

/// Everything assembly needs to know about a session between turns, its history's chunks and
/// files held as `C` and `F` ([`History`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionStateOf<C = Chunk, F = StoredFile> {
    /// Format version at rest (`"v"`); rows written before versioning read as 0, which is the
    /// same shape as 1.
    #[serde(rename = "v")]
    pub version: u16,
    /// The provider chain the next call continues, if any.
    pub chain: Option<ChainState>,
    /// Why the chain was dropped, when it was dropped on the provider's word; reported by the
    /// next request, which starts a new chain.
    pub chain_reset: Option<ChainReason>,
    /// The latched `SolutionContextText` (AGN-034 §4.5): replaced when a turn sends one.
    pub solution_context: Option<String>,
    /// The turn that ended in tool calls and waits for their results.
    pub open_turn: Option<OpenTurn>,
    /// What a new chain is rehydrated from.
    pub history: History<C, F>,
    /// The history's texts are references into `session_texts` (the store's mark; a state
    /// with its texts in place never has it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub texts_by_ref: bool,
}

/// The state with its history's texts in place: what assembly reads.
pub type SessionState = SessionStateOf<Chunk, StoredFile>;

impl<C, F> Default for SessionStateOf<C, F> {
    fn default() -> Self {
        SessionStateOf {
            version: 0,
            chain: None,
            chain_reset: None,
            solution_context: None,
            open_turn: None,
            history: History::default(),
            texts_by_ref: false,
        }
    }
}

/// One provider chain (`previous_response_id` thread) and what it already holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainState {
    /// The last provider response id: the next call's `previous_response_id`.
    pub previous_response_id: String,
    /// When the provider created that response.
    pub responded_at: DateTime<Utc>,
    /// When the chain's first response was created.
    pub started_at: DateTime<Utc>,
    /// Ids of the chunks sent in this chain, oldest first.
    #[serde(default)]
    pub chunk_ids: Vec<String>,
    /// Active files sent in this chain, with the SHA-256 of the version sent last.
    #[serde(default)]
    pub files: Vec<FileHash>,
    /// SHA-256 of the solution context sent in this chain, if it was sent.
    #[serde(default)]
    pub solution_context_sha256: Option<String>,
    /// SHA-256 of the boot prompt the chain follows: its first call's system message, or the
    /// developer message of the last mode change (absent in chains stored before modes could
    /// change: they follow their latest turn's mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_prompt_sha256: Option<String>,
}

impl ChainState {
    /// Whether the chunk with `id` was sent in this chain.
    pub fn has_chunk(&self, id: &str) -> bool {
        self.chunk_ids.iter().any(|c| c == id)
    }

    /// SHA-256 of the version of `path` this chain holds, if any.
    pub fn file_hash(&self, path: &str) -> Option<&str> {
        self.files.iter().find(|f| f.path == path).map(|f| f.sha256.as_str())
    }
}

/// A file path with the SHA-256 of its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256 (hex).
    pub sha256: String,
}

/// A turn that ended in tool calls and waits for the client's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenTurn {
    /// The turn.
    pub turn_id: String,
    /// The mode it ran in.
    pub mode: String,
    /// Its instruction, restored if the chain has to be rebuilt before it ends.
    pub instruction: Option<String>,
    /// The calls the client must answer, in order.
    pub pending_calls: Vec<ToolCall>,
}

/// What the provider answered, as far as session state is concerned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderAnswer {
    /// The provider's response id (`resp_…`).
    pub response_id: String,
    /// When the provider created the response.
    pub created_at: DateTime<Utc>,
    /// A final answer or tool calls.
    pub outcome: AnswerOutcome,
}

/// How a provider response ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AnswerOutcome {
    /// The turn's final output text.
    Final {
        /// The text shown to the user.
        output_text: String,
    },
    /// Calls the client must run before the turn can go on.
    ToolCalls {
        /// The calls, in order.
        calls: Vec<ToolCall>,
    },
}

/// How a request changes the session once the provider has answered it: produced by
/// [`super::assemble`], applied by [`SessionState::apply_answer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// The turn.
    pub turn_id: String,
    /// User turn or tool continuation.
    pub kind: TurnKind,
    /// The mode of the turn.
    pub mode: String,
    /// The instruction of a user turn.
    pub instruction: Option<String>,
    /// Whether the request started a new chain.
    pub new_chain: bool,
    /// Chunks retrieved for this turn and sent, with their text (for history).
    pub chunks: Vec<Chunk>,
    /// Chunks restored from history and sent: the new chain now holds them.
    pub rehydrated_chunk_ids: Vec<String>,
    /// Active files sent with this turn, with their text (for history).
    pub files: Vec<StoredFile>,
    /// Files restored from history and sent: the new chain now holds them.
    pub rehydrated_files: Vec<FileHash>,
    /// Files supplied with this turn but not sent: their stored versions are stale.
    pub skipped_paths: Vec<String>,
    /// The solution context the turn latched, if it sent one.
    pub latched_solution_context: Option<String>,
    /// SHA-256 of the solution context sent, if it was sent.
    pub solution_context_sent_sha256: Option<String>,
    /// SHA-256 of the boot prompt the request sent (a new chain's, or a mode change's), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_prompt_sha256: Option<String>,
}

/// A stored session state this build cannot use.
#[derive(Debug, thiserror::Error)]
pub enum UnusableState {
    /// Not a session state's JSON.
    #[error("session state: {0}")]
    Json(#[from] serde_json::Error),
    /// Written by a newer build.
    #[error("session state has unknown version {0}")]
    Version(u16),
}

impl<C, F> SessionStateOf<C, F> {
    /// The format written now.
    pub const VERSION: u16 = 1;

    /// The same state with each history chunk and file converted (texts in place or by
    /// reference: `texts_by_ref` says which); the first conversion's error.
    pub(crate) fn try_map_history<C2, F2, E>(
        self,
        chunk: impl FnMut(C) -> Result<C2, E>,
        file: impl FnMut(F) -> Result<F2, E>,
        texts_by_ref: bool,
    ) -> Result<SessionStateOf<C2, F2>, E> {
        Ok(SessionStateOf {
            version: self.version,
            chain: self.chain,
            chain_reset: self.chain_reset,
            solution_context: self.solution_context,
            open_turn: self.open_turn,
            history: self.history.try_map(chunk, file)?,
            texts_by_ref,
        })
    }
}

impl SessionState {
    /// The state as `sessions.state` holds it (`{}` for a new session). Unreadable JSON or a
    /// version this build does not know is an error, never an empty state.
    pub fn from_stored(stored: serde_json::Value) -> Result<SessionState, UnusableState> {
        crate::metrics::metrics().json("parse", "session_state");
        let state: SessionState = serde_json::from_value(stored)?;
        if state.version > Self::VERSION {
            return Err(UnusableState::Version(state.version));
        }
        Ok(state)
    }

    /// Whether a continued chain follows another boot prompt than `prompt_sha256` (the mode's
    /// own): the one it recorded, or, for a chain stored before modes could change, its latest
    /// turn's mode against `mode`.
    pub fn follows_other_prompt(&self, prompt_sha256: &str, mode: &str) -> bool {
        let Some(chain) = &self.chain else { return false };
        match &chain.boot_prompt_sha256 {
            Some(sha) => sha != prompt_sha256,
            None => {
                let open = self.open_turn.as_ref().map(|t| t.mode.as_str());
                let last = open.or(self.history.transcript.last().map(|t| t.mode.as_str()));
                last.is_some_and(|m| m != mode)
            }
        }
    }
}

impl<C: Kept<Chunk> + Clone, F: Kept<StoredFile> + Clone> SessionStateOf<C, F> {
    /// The state after the provider answered the request `update` came from.
    pub fn apply_answer(
        &self,
        update: &StateUpdate,
        answer: &ProviderAnswer,
        policy: &AssemblePolicy,
    ) -> Self {
        let mut next = self.clone();
        let mut chain = match (&self.chain, update.new_chain) {
            (Some(chain), false) => chain.clone(),
            _ => ChainState {
                previous_response_id: String::new(),
                responded_at: answer.created_at,
                started_at: answer.created_at,
                chunk_ids: Vec::new(),
                files: Vec::new(),
                solution_context_sha256: None,
                boot_prompt_sha256: None,
            },
        };
        if let Some(sha) = &update.boot_prompt_sha256 {
            chain.boot_prompt_sha256 = Some(sha.clone());
        }
        chain.previous_response_id.clone_from(&answer.response_id);
        chain.responded_at = answer.created_at;
        let sent_ids =
            update.rehydrated_chunk_ids.iter().chain(update.chunks.iter().map(|c| &c.id));
        for id in sent_ids {
            chain.chunk_ids.retain(|c| c != id);
            chain.chunk_ids.push(id.clone());
        }
        let excess = chain.chunk_ids.len().saturating_sub(CHAIN_CHUNK_ID_CAP);
        chain.chunk_ids.drain(..excess);
        let sent_files = update.rehydrated_files.iter().cloned().chain(
            update
                .files
                .iter()
                .map(|f| FileHash { path: f.path.clone(), sha256: f.sha256.clone() }),
        );
        for file in sent_files {
            chain.files.retain(|f| f.path != file.path);
            chain.files.push(file);
        }
        chain.files.retain(|f| !update.skipped_paths.contains(&f.path));
        let excess = chain.files.len().saturating_sub(CHAIN_FILE_CAP);
        chain.files.drain(..excess);
        if update.solution_context_sent_sha256.is_some() {
            chain.solution_context_sha256.clone_from(&update.solution_context_sent_sha256);
        }
        next.chain = Some(chain);
        next.chain_reset = None;
        if update.latched_solution_context.is_some() {
            next.solution_context.clone_from(&update.latched_solution_context);
        }
        next.history.record_sent(&update.chunks, &update.files, &update.skipped_paths, policy);
        next.close_or_keep_turn(update, answer, policy);
        next
    }

    /// Tracks the open turn: a final answer moves it to the transcript, tool calls keep it open.
    fn close_or_keep_turn(
        &mut self,
        update: &StateUpdate,
        answer: &ProviderAnswer,
        policy: &AssemblePolicy,
    ) {
        let mut turn = match (update.kind, self.open_turn.take()) {
            (TurnKind::ToolContinuation, Some(mut open)) if open.turn_id == update.turn_id => {
                // A continuation's instruction is what follow-ups that steered the turn added.
                if let Some(added) = &update.instruction {
                    open.instruction = Some(steered(open.instruction.take(), added));
                }
                open
            }
            _ => OpenTurn {
                turn_id: update.turn_id.clone(),
                mode: update.mode.clone(),
                instruction: update.instruction.clone(),
                pending_calls: Vec::new(),
            },
        };
        match &answer.outcome {
            AnswerOutcome::ToolCalls { calls } => {
                turn.pending_calls.clone_from(calls);
                self.open_turn = Some(turn);
            }
            AnswerOutcome::Final { output_text } => {
                self.history.record_turn(
                    super::history::TranscriptEntry {
                        turn_id: turn.turn_id,
                        mode: turn.mode,
                        instruction: turn.instruction,
                        final_output: output_text.clone(),
                        at: answer.created_at,
                    },
                    policy,
                );
            }
        }
    }

    /// The state after the provider answered `previous_response_not_found`: the next request
    /// starts a new chain, rehydrated from history, and says why. Idempotent.
    pub fn force_new_chain(&self) -> Self {
        let mut next = self.clone();
        if let Some(chain) = next.chain.take() {
            next.chain_reset = Some(ChainReason::PreviousResponseNotFound {
                previous_response_id: chain.previous_response_id,
            });
        }
        next
    }

    /// Whether there is anything to rehydrate a new chain with.
    pub fn has_history(&self) -> bool {
        self.solution_context.is_some() || !self.history.is_empty()
    }
}

/// An open turn's instruction with what follow-ups that steered it `added`, within
/// [`OPEN_INSTRUCTION_MAX_CHARS`] (the turn's own instruction is never cut).
fn steered(own: Option<String>, added: &str) -> String {
    let Some(mut own) = own else {
        let mut added = added.to_owned();
        super::history::shorten(&mut added, OPEN_INSTRUCTION_MAX_CHARS);
        return added;
    };
    let room = OPEN_INSTRUCTION_MAX_CHARS.saturating_sub(super::history::chars(&own) + 2);
    let mut added = added.to_owned();
    super::history::shorten(&mut added, room);
    if !added.is_empty() {
        own.push_str("\n\n");
        own.push_str(&added);
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_ups_grow_an_open_instruction_only_so_far() {
        assert_eq!(steered(Some("own".into()), "more"), "own\n\nmore");
        let own = "o".repeat(1_000);
        let mut text = Some(own.clone());
        // Fifty round trips, each steered by eight of the largest follow-ups.
        for _ in 0..50 {
            text = Some(steered(text, &"s".repeat(8 * 200_000)));
        }
        let text = text.unwrap();
        assert!(super::super::history::chars(&text) <= OPEN_INSTRUCTION_MAX_CHARS);
        assert!(text.starts_with(&own), "the turn's own instruction is kept whole");
    }
}
