//! A retrieved piece of source code: what retrieval returns and the `[CONTEXT]` block renders.

use serde::{Deserialize, Serialize};

/// One indexed chunk of a file, with its exact line span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Stable chunk id (derived from repo, path and content).
    pub id: String,
    /// Path relative to the repository root.
    pub path: String,
    /// First line, 1-based, inclusive.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Language tag used for the code fence (`rust`, `csharp`, `markdown`, ...).
    pub language: String,
    /// The chunk's text, exactly as in the file.
    pub text: String,
    /// Repository the chunk came from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Retrieval score, when the chunk came from a search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
}
