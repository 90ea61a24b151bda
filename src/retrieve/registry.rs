//! [`Retrieval`]: the retrieve stage's entry point. Built once per process from [`Settings`]; it
//! opens each collection's store on first use and shares it (the embedded shard must be opened
//! only once per process), and turns a [`SearchRequest`] into ranked, budgeted chunks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::bm25::Bm25Encoder;
#[cfg(feature = "embedded-store")]
use super::edge::EdgeStore;
use super::embed::Embedder;
use super::server::{ServerConnection, ServerStore};
use super::store::{Selected, StoreQuery, VectorStore};
use super::{filter, select, RetrieveError};
use crate::chunk::Chunk;
use crate::config::{ConnectionUrl, Settings};
use crate::contracts::{ScopeCondition, UserWarning};

/// Warning code when dense retrieval failed and the turn fell back to BM25 only.
pub const DENSE_UNAVAILABLE: &str = "retrieval.dense_unavailable";

/// Most characters of a query searched for: an instruction may hold 200,000, every distinct
/// term of which the BM25 query would carry, and the embeddings endpoint (its key shared by
/// every tenant) would refuse or bill in full; what a turn is about is in its first lines.
pub const MAX_QUERY_CHARS: usize = 8_000;

/// The first [`MAX_QUERY_CHARS`] characters of `text`.
fn query_head(text: &str) -> &str {
    text.char_indices().nth(MAX_QUERY_CHARS).map_or(text, |(at, _)| &text[..at])
}

/// One retrieval for one turn.
#[derive(Debug, Clone, Copy)]
pub struct SearchRequest<'a> {
    /// Collection of the request's AgentContext.
    pub collection: &'a str,
    /// What to search for (usually the instruction).
    pub query_text: &'a str,
    /// The request's `Repo`: restricts results to that repository when set.
    pub repo: Option<&'a str>,
    /// The request's `RagScope` conditions (ANDed).
    pub scope: &'a [ScopeCondition],
    /// Most chunks to return (ConversationContext `top_k`).
    pub top_k: usize,
    /// Most characters of chunk text (ConversationContext `chunk_budget_chars`).
    pub budget_chars: usize,
}

/// What a search found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchOutcome {
    /// Best first, unique ids, within top-k and the budget.
    pub chunks: Vec<Chunk>,
    /// Warnings for the final response (ignored scope keys, degraded retrieval).
    pub warnings: Vec<UserWarning>,
}

#[derive(Debug)]
enum Backend {
    #[cfg(feature = "embedded-store")]
    Embedded {
        data_dir: PathBuf,
    },
    Server(ServerConnection),
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    encoder: Bm25Encoder,
    embedder: Option<Embedder>,
    stores: tokio::sync::Mutex<HashMap<String, Arc<dyn VectorStore>>>,
}

/// Shared retrieval handle; clones share stores, encoder and embedder.
#[derive(Debug, Clone)]
pub struct Retrieval {
    inner: Arc<Inner>,
}

/// The embedded store under `data_dir`, where this build has one.
#[cfg(feature = "embedded-store")]
fn embedded(data_dir: PathBuf) -> Result<Backend, RetrieveError> {
    Ok(Backend::Embedded { data_dir })
}

/// A build without the `embedded-store` feature serves only a Qdrant server.
#[cfg(not(feature = "embedded-store"))]
fn embedded(_data_dir: PathBuf) -> Result<Backend, RetrieveError> {
    Err(RetrieveError::Config(
        "vector.url is unset and this build has no embedded vector store (cargo feature \
         `embedded-store`, on by default): set vector.url to a Qdrant server"
            .into(),
    ))
}

impl Retrieval {
    /// `vector.url` set → Qdrant server; else embedded shards under `vector.data_dir`.
    /// Nothing is opened or contacted until a collection is first used.
    pub fn from_settings(settings: &Settings) -> Result<Self, RetrieveError> {
        let url = settings.vector.url.as_ref().map(ConnectionUrl::expose);
        let backend = match url.filter(|u| !u.trim().is_empty()) {
            Some(_) => Backend::Server(ServerConnection::from_settings(&settings.vector)?),
            None => embedded(settings.vector.data_dir.clone())?,
        };
        Ok(Retrieval {
            inner: Arc::new(Inner {
                backend,
                encoder: Bm25Encoder::new(),
                embedder: Embedder::from_settings(settings)?,
                stores: Default::default(),
            }),
        })
    }

    /// The store of `collection`, opened (and created, with its payload indexes) on first use.
    pub async fn store(&self, collection: &str) -> Result<Arc<dyn VectorStore>, RetrieveError> {
        let mut stores = self.inner.stores.lock().await;
        if let Some(store) = stores.get(collection) {
            return Ok(Arc::clone(store));
        }
        let dense = self.inner.embedder.as_ref().map(Embedder::dimension);
        let store: Arc<dyn VectorStore> = match &self.inner.backend {
            #[cfg(feature = "embedded-store")]
            Backend::Embedded { data_dir } => Arc::new(
                EdgeStore::open_async(data_dir.clone(), collection.to_owned(), dense).await?,
            ),
            Backend::Server(conn) => Arc::new(ServerStore::open(conn, collection, dense).await?),
        };
        stores.insert(collection.to_owned(), Arc::clone(&store));
        Ok(store)
    }

    /// The BM25 encoder shared by indexing and queries.
    pub fn encoder(&self) -> &Bm25Encoder {
        &self.inner.encoder
    }

    /// The dense embedder, when configured.
    pub fn embedder(&self) -> Option<&Embedder> {
        self.inner.embedder.as_ref()
    }

    /// Runs one retrieval: filter from `Repo` and `RagScope`, BM25 (fused with dense when both
    /// exist), then order, dedup, top-k and budget. Errors say whether a retry may help.
    pub async fn search(&self, req: SearchRequest<'_>) -> Result<SearchOutcome, RetrieveError> {
        let (spec, mut warnings) = filter::build(req.repo, req.scope);
        if req.top_k == 0 || req.budget_chars == 0 || req.query_text.trim().is_empty() {
            return Ok(SearchOutcome { chunks: Vec::new(), warnings });
        }
        let store = self.store(req.collection).await?;
        let query = query_head(req.query_text);
        let sparse = self.inner.encoder.query(query);
        let dense = match (&self.inner.embedder, store.dense_dimension()) {
            (Some(embedder), Some(_)) => match embedder.embed(&[query.to_owned()]).await {
                Ok(mut v) => v.pop(),
                Err(e) => {
                    // A turn is still useful with lexical context alone; say so instead of failing it.
                    tracing::warn!(collection = req.collection, error = %e, "dense query embedding failed; using bm25 only");
                    warnings.push(UserWarning {
                        code: DENSE_UNAVAILABLE.to_owned(),
                        message: "semantic retrieval was unavailable; context was retrieved by keywords only"
                            .to_owned(),
                    });
                    None
                }
            },
            _ => None,
        };
        if sparse.indices.is_empty() && dense.is_none() {
            return Ok(SearchOutcome { chunks: Vec::new(), warnings });
        }
        let hybrid = dense.is_some();
        let query =
            StoreQuery { sparse, dense, filter: spec, limit: select::fetch_limit(req.top_k) };
        let Selected { chunks, found } =
            store.query_selected(query, req.top_k, req.budget_chars).await?;
        tracing::debug!(
            collection = req.collection,
            hybrid,
            found,
            returned = chunks.len(),
            "retrieval done"
        );
        Ok(SearchOutcome { chunks, warnings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_cut_at_a_character_boundary() {
        let short = "é".repeat(MAX_QUERY_CHARS);
        assert_eq!(query_head(&short), short);
        let long = format!("{short}tail");
        assert_eq!(query_head(&long), short, "cut after the bound, on a character");
    }
}
