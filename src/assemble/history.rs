//! The stored history a new chain is rehydrated from (Session Architecture §8.2, §9): earlier
//! turns' instructions and final outputs, the chunks sent before and the latest version of each
//! active file. Each kind is kept within its rehydration budget, newest first, and counts what
//! it had to let go so a rehydrated chain can say what was cut.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::stored_file::StoredFile;
use crate::chunk::Chunk;
use crate::config::AssemblePolicy;

/// Most paths remembered as cut: enough to name them, bounded like everything else here.
const FILES_CUT_CAP: usize = 64;
/// Most files a history keeps, whatever their size: the budget counts text, and a session that
/// sends many empty files under new paths would otherwise grow its state (rewritten every round
/// trip) with each turn. The oldest beyond it are cut like those over the budget.
pub(crate) const HISTORY_FILE_CAP: usize = 256;

/// Bounded session history, oldest first in every list. Its chunks and files are `C` and `F`:
/// with their texts (`Chunk`, `StoredFile`) where assembly renders them, by reference where
/// persist only keeps them (`super::packed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct History<C = Chunk, F = StoredFile> {
    /// Finished turns.
    pub transcript: Vec<TranscriptEntry>,
    /// Finished turns dropped to stay within the transcript budget.
    pub transcript_cut: u64,
    /// Chunks sent before, each once, by when it was last sent.
    pub chunks: Vec<C>,
    /// Chunks dropped to stay within the chunk budget.
    pub chunks_cut: u64,
    /// Latest sent version of each active file, by when it was last sent.
    pub files: Vec<F>,
    /// Paths of files dropped to stay within the file budget (and not sent since).
    pub files_cut: Vec<String>,
}

impl<C, F> Default for History<C, F> {
    fn default() -> Self {
        History {
            transcript: Vec::new(),
            transcript_cut: 0,
            chunks: Vec::new(),
            chunks_cut: 0,
            files: Vec::new(),
            files_cut: Vec::new(),
        }
    }
}

/// How the history keeps a chunk or file that was sent (`S`), whatever it holds of its text.
pub trait Kept<S>: Cost {
    /// The entry for `sent`.
    fn kept(sent: &S) -> Self;
    /// What makes two entries one: a chunk's id, a file's path.
    fn key(&self) -> &str;
}

impl Kept<Chunk> for Chunk {
    fn kept(sent: &Chunk) -> Self {
        // Rehydration does not rank by the retrieval score, which belongs to the turn that
        // retrieved the chunk (its saved answer keeps it); at rest it was 17 digits per chunk
        // that lz4 cannot shrink, rewritten with the state on every turn.
        Chunk { score: None, ..sent.clone() }
    }

    fn key(&self) -> &str {
        &self.id
    }
}

impl Kept<StoredFile> for StoredFile {
    fn kept(sent: &StoredFile) -> Self {
        sent.clone()
    }

    fn key(&self) -> &str {
        &self.path
    }
}

/// One finished turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    /// The turn.
    pub turn_id: String,
    /// The mode it ran in.
    pub mode: String,
    /// Its instruction, if it had one.
    pub instruction: Option<String>,
    /// The final output shown to the user.
    pub final_output: String,
    /// When the final answer was created.
    pub at: DateTime<Utc>,
}

/// Something whose size counts against a budget, in characters.
pub trait Cost {
    /// Its size in characters.
    fn cost(&self) -> usize;
}

/// Characters of a text: what the budgets count.
pub(crate) fn chars(text: &str) -> usize {
    text.chars().count()
}

impl Cost for TranscriptEntry {
    fn cost(&self) -> usize {
        self.instruction.as_deref().map_or(0, chars) + chars(&self.final_output)
    }
}

impl Cost for Chunk {
    fn cost(&self) -> usize {
        chars(&self.text)
    }
}

impl Cost for StoredFile {
    fn cost(&self) -> usize {
        chars(&self.text)
    }
}

/// Drops the oldest items until the rest fit `budget`; returns what was dropped.
pub(crate) fn trim_oldest<T: Cost>(items: &mut Vec<T>, budget: usize) -> Vec<T> {
    let mut total: usize = items.iter().map(Cost::cost).sum();
    let mut cut = 0;
    while total > budget && cut < items.len() {
        total -= items[cut].cost();
        cut += 1;
    }
    items.drain(..cut).collect()
}

impl<C, F> History<C, F> {
    /// Whether there is nothing to rehydrate from.
    pub fn is_empty(&self) -> bool {
        self.transcript.is_empty() && self.chunks.is_empty() && self.files.is_empty()
    }

    /// Appends a finished turn, shortened if it alone is over the budget, and drops the oldest
    /// turns that no longer fit.
    pub(crate) fn record_turn(&mut self, mut entry: TranscriptEntry, policy: &AssemblePolicy) {
        shorten_entry(&mut entry, policy.rehydrate_transcript_chars);
        self.transcript.push(entry);
        self.transcript_cut +=
            trim_oldest(&mut self.transcript, policy.rehydrate_transcript_chars).len() as u64;
    }

    pub(crate) fn note_file_cut(&mut self, path: String) {
        if !self.files_cut.contains(&path) {
            self.files_cut.push(path);
        }
        let excess = self.files_cut.len().saturating_sub(FILES_CUT_CAP);
        self.files_cut.drain(..excess);
    }
}

impl<C, F> History<C, F> {
    /// The same history with each chunk and file converted; the first conversion's error.
    pub(crate) fn try_map<C2, F2, E>(
        self,
        chunk: impl FnMut(C) -> Result<C2, E>,
        file: impl FnMut(F) -> Result<F2, E>,
    ) -> Result<History<C2, F2>, E> {
        Ok(History {
            transcript: self.transcript,
            transcript_cut: self.transcript_cut,
            chunks: self.chunks.into_iter().map(chunk).collect::<Result<_, E>>()?,
            chunks_cut: self.chunks_cut,
            files: self.files.into_iter().map(file).collect::<Result<_, E>>()?,
            files_cut: self.files_cut,
        })
    }
}

impl<C: Kept<Chunk>, F: Kept<StoredFile>> History<C, F> {
    /// Remembers chunks and files just sent; files supplied but skipped are forgotten, since
    /// their stored version is no longer the latest.
    pub(crate) fn record_sent(
        &mut self,
        chunks: &[Chunk],
        files: &[StoredFile],
        skipped_paths: &[String],
        policy: &AssemblePolicy,
    ) {
        for chunk in chunks {
            self.chunks.retain(|c| c.key() != chunk.id);
            self.chunks.push(C::kept(chunk));
        }
        self.chunks_cut += trim_oldest(&mut self.chunks, policy.rehydrate_chunk_chars).len() as u64;
        for file in files {
            self.files.retain(|f| f.key() != file.path);
            self.files_cut.retain(|p| *p != file.path);
            self.files.push(F::kept(file));
        }
        self.files.retain(|f| !skipped_paths.iter().any(|p| p == f.key()));
        let mut dropped = trim_oldest(&mut self.files, policy.rehydrate_file_chars);
        let excess = self.files.len().saturating_sub(HISTORY_FILE_CAP);
        dropped.extend(self.files.drain(..excess));
        for file in dropped {
            self.note_file_cut(file.key().to_owned());
        }
    }
}

/// Marker appended where text was shortened.
pub(crate) fn cut_marker(cut_chars: usize) -> String {
    format!("\n[… {cut_chars} more characters cut to fit the history budget …]")
}

/// Shortens a turn to `budget` characters: the instruction gets at most half, the output the
/// rest. Returns whether anything was cut.
pub(crate) fn shorten_entry(entry: &mut TranscriptEntry, budget: usize) -> bool {
    if entry.cost() <= budget {
        return false;
    }
    let mut cut = false;
    if let Some(instruction) = entry.instruction.as_mut() {
        cut |= shorten(instruction, budget / 2);
    }
    let left = budget.saturating_sub(entry.instruction.as_deref().map_or(0, chars));
    cut |= shorten(&mut entry.final_output, left);
    cut
}

/// Keeps the start of `text` within `max` characters, noting how much was cut.
pub(crate) fn shorten(text: &mut String, max: usize) -> bool {
    let total = chars(text);
    if total <= max {
        return false;
    }
    // The marker for the largest possible count is at least as long as the real one, so the
    // result never exceeds `max`.
    let marker_room = chars(&cut_marker(total));
    let keep = max.saturating_sub(marker_room);
    let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    text.truncate(end);
    if marker_room <= max {
        text.push_str(&cut_marker(total - keep));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize, size: usize) -> TranscriptEntry {
        TranscriptEntry {
            turn_id: format!("t{n}"),
            mode: "M".into(),
            instruction: None,
            final_output: "x".repeat(size),
            at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn oldest_turns_go_first_and_are_counted() {
        let policy =
            AssemblePolicy { rehydrate_transcript_chars: 250, ..AssemblePolicy::default() };
        let mut h: History = History::default();
        for n in 0..5 {
            h.record_turn(entry(n, 100), &policy);
        }
        let ids: Vec<_> = h.transcript.iter().map(|e| e.turn_id.as_str()).collect();
        assert_eq!(ids, ["t3", "t4"]);
        assert_eq!(h.transcript_cut, 3);
    }

    #[test]
    fn a_turn_over_the_whole_budget_is_shortened_not_lost() {
        let policy =
            AssemblePolicy { rehydrate_transcript_chars: 200, ..AssemblePolicy::default() };
        let mut h: History = History::default();
        h.record_turn(entry(1, 10_000), &policy);
        assert_eq!(h.transcript.len(), 1);
        assert!(h.transcript[0].cost() <= 200, "{}", h.transcript[0].cost());
        assert!(h.transcript[0].final_output.contains("characters cut"));
    }

    #[test]
    fn sent_chunks_are_remembered_once_without_their_score() {
        let chunk = |id: &str| Chunk {
            id: id.into(),
            path: "a.rs".into(),
            start_line: 1,
            end_line: 2,
            language: "rust".into(),
            text: "fn a() {}".into(),
            repo: Some("r".into()),
            score: Some(7.95),
        };
        let mut h: History = History::default();
        let policy = AssemblePolicy::default();
        h.record_sent(&[chunk("a"), chunk("b")], &[], &[], &policy);
        h.record_sent(&[chunk("a")], &[], &[], &policy);
        let ids: Vec<_> = h.chunks.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["b", "a"], "a chunk sent again moves to the newest end");
        assert!(h.chunks.iter().all(|c| c.score.is_none() && c.repo.is_some()));
    }

    #[test]
    fn empty_files_under_new_paths_are_kept_to_a_count() {
        let file = |n: usize| StoredFile {
            path: format!("dir/{n}.rs"),
            sha256: String::new(),
            language: "rust".into(),
            text: String::new(),
        };
        let mut h: History = History::default();
        let policy = AssemblePolicy::default();
        for turn in 0..8 {
            let files: Vec<_> = (turn * 64..(turn + 1) * 64).map(file).collect();
            h.record_sent(&[], &files, &[], &policy);
        }
        assert_eq!(h.files.len(), HISTORY_FILE_CAP);
        assert_eq!(
            h.files[0].path,
            format!("dir/{}.rs", 8 * 64 - HISTORY_FILE_CAP),
            "the newest kept"
        );
        assert_eq!(h.files_cut.len(), FILES_CUT_CAP, "the cut are named, to a bound");
    }

    #[test]
    fn shorten_respects_char_boundaries() {
        let mut s = "é".repeat(200);
        assert!(shorten(&mut s, 101));
        assert!(s.starts_with('é'));
        assert!(chars(&s) <= 101, "{}", chars(&s));
    }
}
