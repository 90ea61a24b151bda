//! Rehydrating a new chain from stored history (Session Architecture §8.2, §9, §11.3): one user
//! message, placed after the system message and before the new request, restoring a transcript
//! of earlier turns, the chunks sent before and the latest version of every active file, each
//! within its budget, newest kept first, and saying what was cut.

use std::collections::HashSet;

use serde_json::Value;

use super::block::{push_fenced, render_section, ChunkView};
use super::files::{render_files, sent_file};
use super::history::{shorten_entry, trim_oldest, TranscriptEntry};
use super::message::{text_part, user_message_of};
use super::record::{ChainReason, RehydrationRecord, SentChunk, SentFile, WARN_HISTORY_TRUNCATED};
use super::state::{FileHash, SessionState, StoredFile};
use crate::chunk::Chunk;
use crate::config::AssemblePolicy;
use crate::contracts::UserWarning;

/// What a new chain is preloaded with.
#[derive(Debug, Default)]
pub(crate) struct Rehydration {
    /// The restoring user message, `None` when there is nothing to restore.
    pub message: Option<Value>,
    /// Counts of what was restored and cut.
    pub record: RehydrationRecord,
    /// Chunks restored, as recorded.
    pub chunks: Vec<SentChunk>,
    /// Files restored, as recorded.
    pub files: Vec<SentFile>,
    /// A warning for the user when older history was cut.
    pub warning: Option<UserWarning>,
}

impl Rehydration {
    /// Ids of the restored chunks: the new chain holds them once the request is answered.
    pub fn chunk_ids(&self) -> Vec<String> {
        self.chunks.iter().map(|c| c.id.clone()).collect()
    }

    /// The restored files' hashes: the new chain holds these versions once answered.
    pub fn file_hashes(&self) -> Vec<FileHash> {
        self.files
            .iter()
            .map(|f| FileHash { path: f.path.clone(), sha256: f.sha256.clone() })
            .collect()
    }
}

/// Restores `state`'s history for a new chain started for `reason`. Chunks and files the new
/// request sends itself (`sent_chunks`, `turn_paths`) are left out: the request has fresher
/// copies.
pub(crate) fn rehydrate(
    state: &SessionState,
    policy: &AssemblePolicy,
    reason: &ChainReason,
    sent_chunks: &HashSet<&str>,
    turn_paths: &HashSet<&str>,
) -> Rehydration {
    let history = &state.history;
    let mut record = RehydrationRecord::default();

    let mut transcript = history.transcript.clone();
    if let Some(newest) = transcript.last_mut() {
        record.transcript_truncated = shorten_entry(newest, policy.rehydrate_transcript_chars);
    }
    let cut_now = trim_oldest(&mut transcript, policy.rehydrate_transcript_chars).len() as u64;
    record.transcript_turns = transcript.len();
    record.transcript_turns_cut = history.transcript_cut + cut_now;

    let mut chunks: Vec<Chunk> =
        history.chunks.iter().filter(|c| !sent_chunks.contains(c.id.as_str())).cloned().collect();
    record.chunks_cut =
        history.chunks_cut + trim_oldest(&mut chunks, policy.rehydrate_chunk_chars).len() as u64;

    let mut files: Vec<StoredFile> =
        history.files.iter().filter(|f| !turn_paths.contains(f.path.as_str())).cloned().collect();
    let mut files_cut: Vec<String> =
        history.files_cut.iter().filter(|p| !turn_paths.contains(p.as_str())).cloned().collect();
    files_cut
        .extend(trim_oldest(&mut files, policy.rehydrate_file_chars).into_iter().map(|f| f.path));
    record.files_cut = files_cut;

    let mut parts = Vec::new();
    if !transcript.is_empty() || !chunks.is_empty() || !files.is_empty() {
        parts.push(text_part(preamble(reason)));
    }
    if !transcript.is_empty() {
        parts.push(text_part(render_transcript(&transcript, &record)));
    }
    let context_note = (record.chunks_cut > 0).then(|| {
        format!(
            "{} older chunks are not repeated: they did not fit the history budget.",
            record.chunks_cut
        )
    });
    let context = render_section(
        "[EARLIER CONTEXT]",
        context_note.as_deref(),
        chunks.iter().map(ChunkView::from),
        1,
    );
    let files_note = (!record.files_cut.is_empty()).then(|| {
        format!("Not restored (over the history budget): {}.", record.files_cut.join(", "))
    });
    let files_text =
        render_files("[EARLIER ACTIVE FILES]", files_note.as_deref(), &files, chunks.len() + 1);
    for text in [context, files_text] {
        if !text.is_empty() {
            parts.push(text_part(text));
        }
    }

    Rehydration {
        message: (!parts.is_empty()).then(|| user_message_of(parts)),
        warning: record.cut_anything().then(|| truncation_warning(&record)),
        chunks: chunks.iter().map(|c| SentChunk::of(c, true)).collect(),
        files: files.iter().map(|f| sent_file(f, true)).collect(),
        record,
    }
}

/// Why the model is reading restored history.
fn preamble(reason: &ChainReason) -> String {
    let why = match reason {
        ChainReason::PreviousResponseExpired { responded_at, .. } => format!(
            "The provider's copy of this conversation has expired (its last response dates from {}).",
            responded_at.format("%Y-%m-%d")
        ),
        ChainReason::PreviousResponseNotFound { .. } => {
            "The provider no longer holds the earlier state of this conversation.".to_owned()
        }
        ChainReason::NoPreviousResponse | ChainReason::PreviousResponseFresh { .. } => {
            "This conversation continues an earlier session.".to_owned()
        }
    };
    format!(
        "[SESSION HISTORY]\n{why} It is restored below from Aptix's records: earlier turns, the \
         context and the files sent before. The new request follows in the next message."
    )
}

/// The transcript part: earlier turns, oldest first, each instruction and output fenced.
fn render_transcript(turns: &[TranscriptEntry], record: &RehydrationRecord) -> String {
    let mut out = String::from("[TRANSCRIPT]\nEarlier turns of this session, oldest first.");
    if record.transcript_turns_cut > 0 {
        out.push_str(&format!(
            " {} older turns are not shown: they did not fit the history budget.",
            record.transcript_turns_cut
        ));
    }
    if record.transcript_truncated {
        out.push_str(" The newest turn is shortened to fit.");
    }
    out.push_str("\n\n");
    for (n, turn) in (1..).zip(turns) {
        out.push_str(&format!("=== TURN {n} ===\nTurn: {}\nMode: {}\n", turn.turn_id, turn.mode));
        match &turn.instruction {
            Some(instruction) => {
                out.push_str("Instruction:\n");
                push_fenced(&mut out, "text", instruction);
            }
            None => out.push_str("Instruction: (none; the turn sent files or images only)\n"),
        }
        out.push_str("Final output:\n");
        push_fenced(&mut out, "markdown", &turn.final_output);
        out.push('\n');
    }
    out
}

/// The user-facing note that the restored history is incomplete.
fn truncation_warning(record: &RehydrationRecord) -> UserWarning {
    let mut cut = Vec::new();
    if record.transcript_turns_cut > 0 {
        cut.push(format!("{} earlier turns", record.transcript_turns_cut));
    }
    if record.transcript_truncated {
        cut.push("part of the latest turn".to_owned());
    }
    if record.chunks_cut > 0 {
        cut.push(format!("{} earlier context chunks", record.chunks_cut));
    }
    if !record.files_cut.is_empty() {
        cut.push(format!("the files {}", record.files_cut.join(", ")));
    }
    UserWarning {
        code: WARN_HISTORY_TRUNCATED.to_owned(),
        message: format!(
            "The model's copy of this session was rebuilt from stored history without {}.",
            cut.join(", ")
        ),
    }
}
