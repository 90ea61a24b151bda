//! Retrieval errors, classified so the pipeline knows whether a retry can help.

use std::path::PathBuf;

/// Why a vector-store or embedding operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RetrieveError {
    /// The Qdrant server could not be reached, timed out or was overloaded. Retryable.
    #[error("vector store unavailable: {0}")]
    Unavailable(String),
    /// The Qdrant server rejected the operation (bad request, missing permission, ...).
    #[error("vector store rejected the operation: {0}")]
    Rejected(String),
    /// Another process holds the embedded store's lock.
    #[error(
        "embedded vector store {} is in use by another process; stop it, or set vector.url to share a Qdrant server",
        path.display()
    )]
    Locked {
        /// Shard directory.
        path: PathBuf,
    },
    /// The embedded store failed to open, read or write.
    #[error("embedded vector store {} failed: {message}", path.display())]
    Storage {
        /// Shard directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The collection exists with a layout this configuration cannot use.
    #[error("collection `{collection}` is incompatible: {message}")]
    Incompatible {
        /// Collection name.
        collection: String,
        /// What differs.
        message: String,
    },
    /// The embeddings endpoint failed.
    #[error("embedding request failed: {message}")]
    Embedding {
        /// What failed.
        message: String,
        /// Whether a retry may succeed (timeouts, 429, 5xx).
        retryable: bool,
    },
    /// Invalid configuration for retrieval.
    #[error("vector configuration is invalid: {0}")]
    Config(String),
    /// A blocking task panicked or was cancelled.
    #[error("vector store task failed: {0}")]
    Task(String),
}

impl RetrieveError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RetrieveError::Unavailable(_) => true,
            RetrieveError::Embedding { retryable, .. } => *retryable,
            RetrieveError::Rejected(_)
            | RetrieveError::Locked { .. }
            | RetrieveError::Storage { .. }
            | RetrieveError::Incompatible { .. }
            | RetrieveError::Config(_)
            | RetrieveError::Task(_) => false,
        }
    }

    #[cfg(feature = "embedded-store")]
    pub(crate) fn storage(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        RetrieveError::Storage { path: path.to_path_buf(), message: message.to_string() }
    }
}

impl From<tokio::task::JoinError> for RetrieveError {
    fn from(e: tokio::task::JoinError) -> Self {
        RetrieveError::Task(e.to_string())
    }
}

impl From<qdrant_client::QdrantError> for RetrieveError {
    fn from(e: qdrant_client::QdrantError) -> Self {
        use qdrant_client::QdrantError as Q;
        // gRPC codes that say "try again": Cancelled 1, Unknown 2, DeadlineExceeded 4,
        // ResourceExhausted 8, Aborted 10, Internal 13, Unavailable 14.
        const RETRYABLE: [i32; 7] = [1, 2, 4, 8, 10, 13, 14];
        match &e {
            Q::ResponseError { status } if RETRYABLE.contains(&i32::from(status.code())) => {
                RetrieveError::Unavailable(e.to_string())
            }
            Q::ResourceExhaustedError { .. } | Q::Io(_) => {
                RetrieveError::Unavailable(e.to_string())
            }
            _ => RetrieveError::Rejected(e.to_string()),
        }
    }
}
