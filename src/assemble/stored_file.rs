//! An active file as the session state keeps it for rehydration. Its own file so that the
//! history (which rehydrates from it) and the state (which holds the history) do not import each
//! other.

use serde::{Deserialize, Serialize};

/// An active file as stored for rehydration: its latest sent version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256 (hex) of `text`.
    pub sha256: String,
    /// Language tag for the fence.
    pub language: String,
    /// The contents.
    pub text: String,
}
