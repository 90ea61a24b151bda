//! The session state as persist builds the next one: its history's texts held by reference
//! (their SHA-256 key in `session_texts` and their length in characters), the way
//! `sessions.state` stores them. Parsed straight from the stored JSON and written straight
//! back, it spares persist what the state with its texts in place costs on every turn: the
//! texts put back, the state turned into a tree and back, and every text hashed again to take
//! it out. Only texts sent this turn are hashed ([`PackedState::take_new_texts`]).
//!
//! A stored entry is `{…, "text_ref": key, "text_chars": n}`; one with its text in place
//! (`"text"`: rows written before texts went by reference, or a text sent this turn) is read as
//! [`PackedText::New`]. A reference without its length (rows written before lengths were kept)
//! is not a packed state: the store reads such a state with its texts in place instead, and the
//! next write stores the lengths.

use serde::{Deserialize, Serialize, Serializer};

use super::history::{chars, Cost, Kept};
use super::state::{SessionState, SessionStateOf, StoredFile, UnusableState};
use crate::chunk::Chunk;

/// The state with its history's texts by reference.
pub type PackedState = SessionStateOf<ChunkRef, FileRef>;

/// A history text as persist holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackedText {
    /// In `session_texts` under `key`.
    Stored {
        /// SHA-256 (hex) of the text.
        key: String,
        /// Its length in characters, what the history's budgets count.
        chars: usize,
    },
    /// Not known to be stored: sent this turn, or read in place from an older row.
    New(String),
}

impl PackedText {
    fn chars(&self) -> usize {
        match self {
            PackedText::Stored { chars, .. } => *chars,
            PackedText::New(text) => chars(text),
        }
    }

    /// The text from its stored fields; `None` for a reference without its length.
    fn read(text: Option<String>, key: Option<String>, chars: Option<usize>) -> Option<Self> {
        match (text, key, chars) {
            (Some(text), _, _) => Some(PackedText::New(text)),
            (None, Some(key), Some(chars)) => Some(PackedText::Stored { key, chars }),
            _ => None,
        }
    }

    /// The stored fields: the text in place, or its key and length.
    fn fields(&self) -> (Option<&str>, Option<&str>, Option<usize>) {
        match self {
            PackedText::Stored { key, chars } => (None, Some(key), Some(*chars)),
            PackedText::New(text) => (Some(text), None, None),
        }
    }
}

/// A chunk of the history, its text by reference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "ChunkFields")]
pub struct ChunkRef {
    /// Stable chunk id.
    pub id: String,
    /// Path relative to the repository root.
    pub path: String,
    /// First line, 1-based, inclusive.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Language tag for the fence.
    pub language: String,
    /// Repository the chunk came from, when known.
    pub repo: Option<String>,
    /// Its text.
    pub text: PackedText,
}

/// A file of the history, its text by reference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "FileFields")]
pub struct FileRef {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256 (hex) of its contents.
    pub sha256: String,
    /// Language tag for the fence.
    pub language: String,
    /// Its contents.
    pub text: PackedText,
}

/// A stored history chunk's fields (`repo` absent when unknown; a score is never stored).
#[derive(Serialize, Deserialize)]
struct ChunkFields<T = String> {
    id: T,
    path: T,
    start_line: u32,
    end_line: u32,
    language: T,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repo: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text_ref: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text_chars: Option<usize>,
}

/// A stored history file's fields.
#[derive(Serialize, Deserialize)]
struct FileFields<T = String> {
    path: T,
    sha256: T,
    language: T,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text_ref: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text_chars: Option<usize>,
}

/// Why a stored entry is not a packed one.
const NOT_PACKED: &str = "a history text neither in place nor referenced with its length";

impl TryFrom<ChunkFields> for ChunkRef {
    type Error = &'static str;

    fn try_from(f: ChunkFields) -> Result<Self, Self::Error> {
        let text = PackedText::read(f.text, f.text_ref, f.text_chars).ok_or(NOT_PACKED)?;
        Ok(ChunkRef {
            id: f.id,
            path: f.path,
            start_line: f.start_line,
            end_line: f.end_line,
            language: f.language,
            repo: f.repo,
            text,
        })
    }
}

impl TryFrom<FileFields> for FileRef {
    type Error = &'static str;

    fn try_from(f: FileFields) -> Result<Self, Self::Error> {
        let text = PackedText::read(f.text, f.text_ref, f.text_chars).ok_or(NOT_PACKED)?;
        Ok(FileRef { path: f.path, sha256: f.sha256, language: f.language, text })
    }
}

impl Serialize for ChunkRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (text, text_ref, text_chars) = self.text.fields();
        ChunkFields::<&str> {
            id: &self.id,
            path: &self.path,
            start_line: self.start_line,
            end_line: self.end_line,
            language: &self.language,
            repo: self.repo.as_deref(),
            text,
            text_ref,
            text_chars,
        }
        .serialize(s)
    }
}

impl Serialize for FileRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (text, text_ref, text_chars) = self.text.fields();
        FileFields::<&str> {
            path: &self.path,
            sha256: &self.sha256,
            language: &self.language,
            text,
            text_ref,
            text_chars,
        }
        .serialize(s)
    }
}

impl Cost for ChunkRef {
    fn cost(&self) -> usize {
        self.text.chars()
    }
}

impl Cost for FileRef {
    fn cost(&self) -> usize {
        self.text.chars()
    }
}

impl Kept<Chunk> for ChunkRef {
    fn kept(sent: &Chunk) -> Self {
        ChunkRef::new(sent.clone())
    }

    fn key(&self) -> &str {
        &self.id
    }
}

impl Kept<StoredFile> for FileRef {
    fn kept(sent: &StoredFile) -> Self {
        FileRef::from(sent.clone())
    }

    fn key(&self) -> &str {
        &self.path
    }
}

impl PackedState {
    /// The stored JSON of a state whose texts are all in place or referenced with their length;
    /// an error otherwise (not a state, a version this build does not know, or a reference
    /// without its length, which the caller reads with its texts in place instead).
    pub fn from_stored_json(stored: &str) -> Result<PackedState, UnusableState> {
        crate::metrics::metrics().json("parse", "session_state_packed");
        Self::checked(serde_json::from_str(stored)?)
    }

    /// The same from a tree.
    pub fn from_stored_value(stored: &serde_json::Value) -> Result<PackedState, UnusableState> {
        crate::metrics::metrics().json("parse", "session_state_packed");
        Self::checked(PackedState::deserialize(stored)?)
    }

    fn checked(state: PackedState) -> Result<PackedState, UnusableState> {
        if state.version > Self::VERSION {
            return Err(UnusableState::Version(state.version));
        }
        // The store marks a state whose texts it took out; a reference in another is corrupt.
        if !state.texts_by_ref && state.text_keys().next().is_some() {
            let e = "a text reference in a state not marked texts_by_ref";
            return Err(UnusableState::Json(serde::de::Error::custom(e)));
        }
        Ok(state)
    }

    /// Texts not yet stored become references, written with the current version: each such
    /// text once, with its key, for `session_texts`.
    pub fn take_new_texts(&mut self) -> Vec<(String, String)> {
        self.version = Self::VERSION;
        self.texts_by_ref = true;
        let texts = self.history.chunks.iter_mut().map(|c| &mut c.text);
        let texts = texts.chain(self.history.files.iter_mut().map(|f| &mut f.text));
        let mut taken: Vec<(String, String)> = Vec::new();
        for text in texts {
            let PackedText::New(body) = text else { continue };
            let key = super::sha256_hex(body.as_str());
            let body = std::mem::take(body);
            let chars = chars(&body);
            *text = PackedText::Stored { key: key.clone(), chars };
            if !taken.iter().any(|(k, _)| *k == key) {
                taken.push((key, body));
            }
        }
        taken
    }
}

impl PackedState {
    /// The keys of the texts it holds by reference (a text two entries share, twice).
    pub fn text_keys(&self) -> impl Iterator<Item = &str> {
        let chunks = self.history.chunks.iter().map(|c| &c.text);
        chunks.chain(self.history.files.iter().map(|f| &f.text)).filter_map(|t| match t {
            PackedText::Stored { key, .. } => Some(key.as_str()),
            PackedText::New(_) => None,
        })
    }

    /// The state with its texts in place, each referenced text `text(key)`; the key of one
    /// that is not there.
    pub fn with_texts(self, text: impl Fn(&str) -> Option<String>) -> Result<SessionState, String> {
        let body = |t: PackedText| match t {
            PackedText::New(body) => Ok(body),
            PackedText::Stored { key, .. } => text(&key).ok_or(key),
        };
        let h = self.history;
        let chunks = h.chunks.into_iter().map(|c| {
            Ok(Chunk {
                id: c.id,
                path: c.path,
                start_line: c.start_line,
                end_line: c.end_line,
                language: c.language,
                text: body(c.text)?,
                repo: c.repo,
                score: None,
            })
        });
        let chunks = chunks.collect::<Result<_, String>>()?;
        let files = h.files.into_iter().map(|f| {
            let text = body(f.text)?;
            Ok(StoredFile { path: f.path, sha256: f.sha256, language: f.language, text })
        });
        let files = files.collect::<Result<_, String>>()?;
        Ok(SessionState {
            version: self.version,
            chain: self.chain,
            chain_reset: self.chain_reset,
            solution_context: self.solution_context,
            open_turn: self.open_turn,
            history: super::History {
                transcript: h.transcript,
                transcript_cut: h.transcript_cut,
                chunks,
                chunks_cut: h.chunks_cut,
                files,
                files_cut: h.files_cut,
            },
            texts_by_ref: false,
        })
    }
}

impl ChunkRef {
    /// A chunk with its text, the text new (a chunk's score is not kept).
    fn new(c: Chunk) -> Self {
        ChunkRef {
            id: c.id,
            path: c.path,
            start_line: c.start_line,
            end_line: c.end_line,
            language: c.language,
            repo: c.repo,
            text: PackedText::New(c.text),
        }
    }
}

impl From<StoredFile> for FileRef {
    /// A file with its text, the text new.
    fn from(f: StoredFile) -> Self {
        FileRef {
            path: f.path,
            sha256: f.sha256,
            language: f.language,
            text: PackedText::New(f.text),
        }
    }
}

impl From<SessionState> for PackedState {
    /// A state read with its texts in place, each text new.
    fn from(s: SessionState) -> Self {
        let h = s.history;
        PackedState {
            version: s.version,
            chain: s.chain,
            chain_reset: s.chain_reset,
            solution_context: s.solution_context,
            open_turn: s.open_turn,
            history: super::History {
                transcript: h.transcript,
                transcript_cut: h.transcript_cut,
                chunks: h.chunks.into_iter().map(ChunkRef::new).collect(),
                chunks_cut: h.chunks_cut,
                files: h.files.into_iter().map(FileRef::from).collect(),
                files_cut: h.files_cut,
            },
            texts_by_ref: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use chrono::{DateTime, Utc};
    use serde_json::json;

    use super::*;
    use crate::assemble::{AnswerOutcome, ProviderAnswer, StateUpdate, TurnKind};
    use crate::config::AssemblePolicy;

    fn chunk(id: usize, size: usize) -> Chunk {
        Chunk {
            id: format!("c{id}"),
            path: format!("src/f{}.rs", id % 3),
            start_line: 1,
            end_line: 9,
            language: "rust".into(),
            // Multi-byte characters: the budgets count characters, not bytes.
            text: format!("// {id} ") + &"é".repeat(size),
            repo: id.is_multiple_of(2).then(|| "r".into()),
            score: Some(0.5),
        }
    }

    fn file(path: &str, version: usize) -> StoredFile {
        let text = format!("v{version} ") + &"x".repeat(300);
        StoredFile {
            path: path.into(),
            sha256: crate::assemble::sha256_hex(&text),
            language: "rust".into(),
            text,
        }
    }

    /// Turn `n` of a session: chunks old and new, a file changed now and then, one skipped.
    fn update(n: usize) -> (StateUpdate, ProviderAnswer) {
        let update = StateUpdate {
            turn_id: format!("t{n}"),
            kind: TurnKind::UserTurn,
            mode: "Agent".into(),
            instruction: Some(format!("step {n}")),
            new_chain: n.is_multiple_of(4),
            chunks: (n..n + 3).map(|i| chunk(i * 2 % 11, 40 + i * 7)).collect(),
            rehydrated_chunk_ids: Vec::new(),
            files: [file("a.rs", n / 2), file(&format!("b{}.rs", n % 3), n)].into(),
            rehydrated_files: Vec::new(),
            skipped_paths: if n % 5 == 4 { vec!["b1.rs".into()] } else { Vec::new() },
            latched_solution_context: None,
            solution_context_sent_sha256: None,
            boot_prompt_sha256: None,
        };
        let outcome = AnswerOutcome::Final { output_text: format!("done {n}") };
        let at = DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(n as i64);
        (update, ProviderAnswer { response_id: format!("resp_{n}"), created_at: at, outcome })
    }

    /// The packed state with its texts put back from `stored`, as stored JSON.
    fn in_place(packed: &PackedState, stored: &HashMap<String, String>) -> serde_json::Value {
        let mut value = serde_json::to_value(packed).unwrap();
        value.as_object_mut().unwrap().remove("texts_by_ref");
        for list in ["chunks", "files"] {
            for entry in value["history"][list].as_array_mut().unwrap() {
                let entry = entry.as_object_mut().unwrap();
                let key = entry.remove("text_ref").unwrap();
                let chars = entry.remove("text_chars").unwrap();
                let text = &stored[key.as_str().unwrap()];
                assert_eq!(chars, json!(text.chars().count()));
                entry.insert("text".into(), json!(text));
            }
        }
        value
    }

    #[test]
    fn a_state_kept_by_reference_through_its_turns_is_the_state_kept_with_its_texts() {
        // Small budgets, so chunks, files and turns are cut along the way.
        let policy = AssemblePolicy {
            rehydrate_chunk_chars: 400,
            rehydrate_file_chars: 900,
            rehydrate_transcript_chars: 60,
            ..AssemblePolicy::default()
        };
        let (mut whole, mut packed) = (SessionState::default(), PackedState::default());
        let mut stored: HashMap<String, String> = HashMap::new();
        for n in 0..12 {
            let (update, answer) = update(n);
            whole = whole.apply_answer(&update, &answer, &policy);
            let mut next = packed.apply_answer(&update, &answer, &policy);
            let new = next.take_new_texts();
            assert!(new.len() <= 5, "only this turn's texts are new: {}", new.len());
            stored.extend(new);
            // Each turn reads back what the last one wrote.
            let json = serde_json::to_string(&next).unwrap();
            packed = PackedState::from_stored_json(&json).unwrap();
            assert!(packed.texts_by_ref && packed.version == PackedState::VERSION);
            let mut expected = serde_json::to_value(&whole).unwrap();
            expected["v"] = json!(PackedState::VERSION);
            assert_eq!(in_place(&packed, &stored), expected, "after turn {n}");
            // What assembly reads: the same state with its texts put back.
            let read = packed.clone().with_texts(|key| stored.get(key).cloned()).unwrap();
            assert_eq!(read, SessionState { version: PackedState::VERSION, ..whole.clone() });
        }
        assert!(whole.history.chunks_cut > 0 && !whole.history.files_cut.is_empty());
        assert!(whole.history.transcript_cut > 0);
    }

    #[test]
    fn texts_in_place_are_new_and_a_reference_without_its_length_is_not_packed() {
        let inline = json!({"v": 1, "history": {"chunks": [{"id": "a", "path": "a.rs",
            "start_line": 1, "end_line": 2, "language": "rust", "text": "fn a() {}"}]}});
        let state = PackedState::from_stored_value(&inline).unwrap();
        assert_eq!(state.history.chunks[0].text, PackedText::New("fn a() {}".into()));
        let mut by_ref = inline.clone();
        let entry = by_ref["history"]["chunks"][0].as_object_mut().unwrap();
        entry.remove("text");
        entry.insert("text_ref".into(), json!(crate::assemble::sha256_hex("fn a() {}")));
        entry.insert("text_chars".into(), json!(9));
        assert!(PackedState::from_stored_value(&by_ref).is_err(), "references, unmarked");
        by_ref["texts_by_ref"] = json!(true);
        let state = PackedState::from_stored_json(&by_ref.to_string()).unwrap();
        let mut old = by_ref.clone();
        old["history"]["chunks"][0].as_object_mut().unwrap().remove("text_chars");
        assert!(PackedState::from_stored_value(&old).is_err(), "written before lengths");
        assert_eq!(state.history.chunks[0].cost(), 9);
        assert!(PackedState::from_stored_value(&json!({"v": 9})).is_err(), "a newer version");
        let missing = state.with_texts(|_| None).unwrap_err();
        assert_eq!(missing, crate::assemble::sha256_hex("fn a() {}"), "a text not stored");
    }
}
