//! The backend abstraction: what both Qdrant backends do, in the same payload schema.

use std::collections::HashMap;

use async_trait::async_trait;

use super::bm25::SparseVec;
use super::filter::FilterSpec;
use super::payload::ChunkPayload;
use super::RetrieveError;
use crate::chunk::Chunk;

/// A chunk ready to be written: payload plus vectors.
#[derive(Debug, Clone)]
pub struct ChunkPoint {
    /// The payload; `chunk_id` is the point id.
    pub payload: ChunkPayload,
    /// BM25 document vector.
    pub sparse: SparseVec,
    /// Dense embedding, when the collection has one.
    pub dense: Option<Vec<f32>>,
}

/// A query against one collection.
#[derive(Debug, Clone)]
pub struct StoreQuery {
    /// BM25 query vector.
    pub sparse: SparseVec,
    /// Dense query embedding; with it, sparse and dense results are fused (RRF).
    pub dense: Option<Vec<f32>>,
    /// Restrictions.
    pub filter: FilterSpec,
    /// Most points to return.
    pub limit: usize,
}

/// The chunks a query selected, and how many hits it had to choose from.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected {
    /// Best first.
    pub chunks: Vec<Chunk>,
    /// Hits scored.
    pub found: usize,
}

/// What the indexer needs to know about a stored chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    /// Chunk (point) id.
    pub chunk_id: String,
    /// File it belongs to.
    pub path: String,
}

/// One collection in a Qdrant backend. Object-safe; implementations are `Send + Sync` and cheap
/// to share behind an `Arc`.
#[async_trait]
pub trait VectorStore: Send + Sync + std::fmt::Debug {
    /// Collection name.
    fn collection(&self) -> &str;

    /// Dimension of the collection's dense vector, if it has one.
    fn dense_dimension(&self) -> Option<usize>;

    /// Best-scoring chunks first, with scores. Sparse-only, or RRF of sparse and dense.
    async fn query(&self, query: StoreQuery) -> Result<Vec<Chunk>, RetrieveError>;

    /// What [`super::select::select`] keeps of `query`'s hits: best first, one per chunk id, at
    /// most `top_k`, within `budget_chars`. A store that can score without reading payloads
    /// reads the texts of the candidates it offers, not of every hit.
    async fn query_selected(
        &self,
        query: StoreQuery,
        top_k: usize,
        budget_chars: usize,
    ) -> Result<Selected, RetrieveError> {
        let hits = self.query(query).await?;
        let found = hits.len();
        Ok(Selected { chunks: super::select::select(hits, top_k, budget_chars), found })
    }

    /// Inserts or replaces points (by chunk id).
    async fn upsert(&self, points: Vec<ChunkPoint>) -> Result<(), RetrieveError>;

    /// Deletes points by chunk id; unknown ids are ignored.
    async fn delete(&self, chunk_ids: Vec<String>) -> Result<(), RetrieveError>;

    /// Every stored chunk of a repository, by chunk id.
    async fn list(&self, repo: &str) -> Result<HashMap<String, StoredChunk>, RetrieveError>;

    /// Number of points matching the filter.
    async fn count(&self, filter: FilterSpec) -> Result<usize, RetrieveError>;

    /// Makes every write so far durable (the embedded store does not replay its WAL on open).
    async fn flush(&self) -> Result<(), RetrieveError>;
}

/// Candidates each side contributes to a hybrid fusion, in both backends.
pub(super) fn prefetch_limit(limit: usize) -> usize {
    (limit * 4).max(50)
}
