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
        let chunk = |c: ChunkRef| {
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
        };
        let file = |f: FileRef| {
            let text = body(f.text)?;
            Ok(StoredFile { path: f.path, sha256: f.sha256, language: f.language, text })
        };
        self.try_map_history(chunk, file, false)
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
        let chunk = |c| Ok::<_, std::convert::Infallible>(ChunkRef::new(c));
        match s.try_map_history(chunk, |f| Ok(FileRef::from(f)), false) {
            Ok(state) => state,
            Err(never) => match never {},
        }
    }
}

#[cfg(test)]
mod tests;
