//! Retrieval of indexed source chunks from Qdrant (DESIGN.md §6.6).
//!
//! Two backends behind one object-safe [`VectorStore`] trait, with the same payload schema
//! ([`payload`]), filters ([`filter`]) and scores:
//! - `edge::EdgeStore` (default; cargo feature `embedded-store`, on by default): an embedded,
//!   on-disk Qdrant Edge shard per collection under
//!   `vector.data_dir/<collection>`. Qdrant Edge is synchronous, so every call runs on the blocking
//!   pool. The shard directory is locked by the process that opens it: open it once per process
//!   (the [`Retrieval`] registry does) and run retrieval in one process, or use a server.
//! - [`server::ServerStore`]: a Qdrant server over gRPC (`qdrant-client`) when `vector.url` is set.
//!
//! Queries are BM25 sparse vectors by default ([`bm25`]), computed here with one tokenizer for
//! documents and queries in both backends (Qdrant applies IDF). With `vector.embeddings_url` set,
//! dense vectors from an OpenAI-compatible endpoint ([`embed`]) are added and results fused by
//! reciprocal rank fusion. [`select`] then orders, deduplicates and fits chunks to top-k and budget.

pub mod bm25;
#[cfg(feature = "embedded-store")]
pub mod edge;
#[cfg(feature = "embedded-store")]
mod edge_ops;
pub mod embed;
mod error;
pub mod eval;
pub mod filter;
pub mod payload;
mod registry;
pub mod select;
pub mod server;
mod store;

pub use error::RetrieveError;
pub use registry::{Retrieval, SearchOutcome, SearchRequest};
pub use store::{ChunkPoint, Selected, StoreQuery, StoredChunk, VectorStore};

/// Name of the sparse (BM25) vector in every collection.
pub const SPARSE_VECTOR: &str = "bm25";
/// Name of the optional dense vector in every collection.
pub const DENSE_VECTOR: &str = "dense";
/// Reciprocal rank fusion constant (the usual 60; Qdrant Edge's internal default is 2).
pub const RRF_K: usize = 60;
