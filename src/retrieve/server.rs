//! The server backend: a Qdrant server over gRPC (`qdrant-client`), used when `vector.url` is
//! set. Collections and payload indexes are created on first use; writes wait for the server to
//! apply them, so [`VectorStore::flush`] has nothing left to do.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use qdrant_client::qdrant::{
    vectors_config, CountPointsBuilder, CreateCollectionBuilder, CreateFieldIndexCollectionBuilder,
    DeletePointsBuilder, Distance, FieldType, Modifier, NamedVectors, PayloadIncludeSelector,
    PointId, PointStruct, PointsIdsList, PrefetchQueryBuilder, Query, QueryPointsBuilder,
    RrfBuilder, ScrollPointsBuilder, SparseVectorConfig, SparseVectorParams, UpsertPointsBuilder,
    Vector, VectorInput, VectorParamsBuilder, VectorsConfigBuilder,
};
use qdrant_client::{Payload, Qdrant};

use super::filter::{self, FilterSpec};
use super::payload::{ChunkPayload, INDEXED_KEYWORD_FIELDS};
use super::store::{prefetch_limit, ChunkPoint, StoreQuery, StoredChunk, VectorStore};
use super::{RetrieveError, DENSE_VECTOR, RRF_K, SPARSE_VECTOR};
use crate::chunk::Chunk;
use crate::config::{ConnectionUrl, VectorSettings};

/// Points per upsert request.
const UPSERT_BATCH: usize = 256;

/// A connection to a Qdrant server, shared by every collection.
#[derive(Clone)]
pub struct ServerConnection {
    client: Arc<Qdrant>,
}

impl std::fmt::Debug for ServerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConnection").finish_non_exhaustive()
    }
}

impl ServerConnection {
    /// Connects lazily to `vector.url` with the API key and the configured timeouts.
    pub fn from_settings(v: &VectorSettings) -> Result<Self, RetrieveError> {
        let url = v
            .url
            .as_ref()
            .map(ConnectionUrl::expose)
            .ok_or_else(|| RetrieveError::Config("vector.url is not set".into()))?;
        let client = Qdrant::from_url(url)
            .api_key(v.api_key.as_ref().map(|k| k.expose().to_owned()))
            .timeout(Duration::from_secs(v.timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(v.connect_timeout_secs.max(1)))
            // The check prints to stdout and blocks on a health call at construction.
            .skip_compatibility_check()
            .build()
            .map_err(|e| RetrieveError::Config(format!("vector.url: {e}")))?;
        Ok(ServerConnection { client: Arc::new(client) })
    }
}

/// One collection on a Qdrant server.
#[derive(Clone)]
pub struct ServerStore {
    client: Arc<Qdrant>,
    collection: String,
    dense: Option<usize>,
}

impl std::fmt::Debug for ServerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerStore")
            .field("collection", &self.collection)
            .field("dense", &self.dense)
            .finish()
    }
}

impl ServerStore {
    /// Opens `collection`, creating it (BM25 with IDF, plus a dense vector of dimension `dense`)
    /// and its payload indexes if it does not exist.
    pub async fn open(
        conn: &ServerConnection,
        collection: &str,
        dense: Option<usize>,
    ) -> Result<Self, RetrieveError> {
        let client = Arc::clone(&conn.client);
        if !client.collection_exists(collection).await? {
            let mut sparse = HashMap::new();
            sparse.insert(
                SPARSE_VECTOR.to_owned(),
                SparseVectorParams { modifier: Some(Modifier::Idf as i32), ..Default::default() },
            );
            let mut create = CreateCollectionBuilder::new(collection)
                .sparse_vectors_config(SparseVectorConfig { map: sparse });
            if let Some(dim) = dense {
                let mut vectors = VectorsConfigBuilder::default();
                vectors.add_named_vector_params(
                    DENSE_VECTOR,
                    VectorParamsBuilder::new(dim as u64, Distance::Cosine),
                );
                create = create.vectors_config(vectors);
            }
            // Another process may create it at the same moment; only a still-missing collection is an error.
            if let Err(e) = client.create_collection(create).await {
                if !client.collection_exists(collection).await? {
                    return Err(e.into());
                }
            }
            for field in INDEXED_KEYWORD_FIELDS {
                client
                    .create_field_index(
                        CreateFieldIndexCollectionBuilder::new(
                            collection,
                            field,
                            FieldType::Keyword,
                        )
                        .wait(true),
                    )
                    .await?;
            }
            tracing::info!(collection, dense = ?dense, "qdrant collection created");
        }
        let stored_dense = dense_size(&client, collection).await?;
        if let (Some(want), Some(have)) = (dense, stored_dense) {
            if want != have {
                return Err(RetrieveError::Incompatible {
                    collection: collection.to_owned(),
                    message: format!(
                        "dense vectors have dimension {have}, configuration says {want}"
                    ),
                });
            }
        }
        Ok(ServerStore { client, collection: collection.to_owned(), dense: stored_dense })
    }
}

async fn dense_size(client: &Qdrant, collection: &str) -> Result<Option<usize>, RetrieveError> {
    let info = client.collection_info(collection).await?;
    let config =
        info.result.and_then(|r| r.config).and_then(|c| c.params).and_then(|p| p.vectors_config);
    Ok(match config.and_then(|c| c.config) {
        Some(vectors_config::Config::ParamsMap(m)) => {
            m.map.get(DENSE_VECTOR).map(|p| p.size as usize)
        }
        _ => None,
    })
}

fn to_chunk(
    payload: HashMap<String, qdrant_client::qdrant::Value>,
    score: f32,
) -> Result<Chunk, RetrieveError> {
    let json = serde_json::Value::from(Payload::from(payload));
    let payload: ChunkPayload = serde_json::from_value(json)
        .map_err(|e| RetrieveError::Rejected(format!("point payload is not a chunk: {e}")))?;
    Ok(payload.into_chunk(Some(score)))
}

#[async_trait]
impl VectorStore for ServerStore {
    fn collection(&self) -> &str {
        &self.collection
    }

    fn dense_dimension(&self) -> Option<usize> {
        self.dense
    }

    async fn query(&self, q: StoreQuery) -> Result<Vec<Chunk>, RetrieveError> {
        let sparse = || VectorInput::new_sparse(q.sparse.indices.clone(), q.sparse.values.clone());
        let mut request =
            QueryPointsBuilder::new(&self.collection).limit(q.limit as u64).with_payload(true);
        if let Some(f) = filter::to_server(&q.filter) {
            request = request.filter(f);
        }
        request = match (&q.dense, self.dense.is_some()) {
            (Some(dense), true) => {
                let limit = prefetch_limit(q.limit) as u64;
                request
                    .add_prefetch(
                        PrefetchQueryBuilder::default()
                            .query(Query::new_nearest(sparse()))
                            .using(SPARSE_VECTOR)
                            .limit(limit),
                    )
                    .add_prefetch(
                        PrefetchQueryBuilder::default()
                            .query(Query::new_nearest(VectorInput::new_dense(dense.clone())))
                            .using(DENSE_VECTOR)
                            .limit(limit),
                    )
                    .query(Query::new_rrf(RrfBuilder::with_k(RRF_K as u32)))
            }
            _ => request.query(Query::new_nearest(sparse())).using(SPARSE_VECTOR),
        };
        let response = self.client.query(request).await?;
        response.result.into_iter().map(|p| to_chunk(p.payload, p.score)).collect()
    }

    async fn upsert(&self, points: Vec<ChunkPoint>) -> Result<(), RetrieveError> {
        let mut structs = Vec::with_capacity(points.len());
        for p in points {
            let mut vectors = NamedVectors::default()
                .add_vector(SPARSE_VECTOR, Vector::new_sparse(p.sparse.indices, p.sparse.values));
            if let (Some(dense), true) = (p.dense, self.dense.is_some()) {
                vectors = vectors.add_vector(DENSE_VECTOR, Vector::new_dense(dense));
            }
            let json = serde_json::to_value(&p.payload)
                .map_err(|e| RetrieveError::Config(e.to_string()))?;
            let payload =
                Payload::try_from(json).map_err(|e| RetrieveError::Config(e.to_string()))?;
            structs.push(PointStruct::new(
                PointId::from(p.payload.chunk_id.clone()),
                vectors,
                payload,
            ));
        }
        for batch in structs.chunks(UPSERT_BATCH) {
            self.client
                .upsert_points(
                    UpsertPointsBuilder::new(&self.collection, batch.to_vec()).wait(true),
                )
                .await?;
        }
        Ok(())
    }

    async fn delete(&self, chunk_ids: Vec<String>) -> Result<(), RetrieveError> {
        for batch in chunk_ids.chunks(1_000) {
            let ids =
                PointsIdsList { ids: batch.iter().map(|id| PointId::from(id.as_str())).collect() };
            self.client
                .delete_points(DeletePointsBuilder::new(&self.collection).points(ids).wait(true))
                .await?;
        }
        Ok(())
    }

    async fn list(&self, repo: &str) -> Result<HashMap<String, StoredChunk>, RetrieveError> {
        let (spec, _) = filter::build(Some(repo), &[]);
        let mut out = HashMap::new();
        let mut offset: Option<PointId> = None;
        loop {
            let mut request = ScrollPointsBuilder::new(&self.collection).limit(2_000).with_payload(
                PayloadIncludeSelector { fields: vec!["chunk_id".into(), "path".into()] },
            );
            if let Some(f) = filter::to_server(&spec) {
                request = request.filter(f);
            }
            if let Some(o) = offset.take() {
                request = request.offset(o);
            }
            let page = self.client.scroll(request).await?;
            for p in page.result {
                let get = |k: &str| p.payload.get(k).and_then(|v| v.as_str()).map(|s| s.to_owned());
                if let (Some(chunk_id), Some(path)) = (get("chunk_id"), get("path")) {
                    out.insert(chunk_id.clone(), StoredChunk { chunk_id, path });
                }
            }
            match page.next_page_offset {
                Some(next) => offset = Some(next),
                None => return Ok(out),
            }
        }
    }

    async fn count(&self, spec: FilterSpec) -> Result<usize, RetrieveError> {
        let mut request = CountPointsBuilder::new(&self.collection).exact(true);
        if let Some(f) = filter::to_server(&spec) {
            request = request.filter(f);
        }
        let response = self.client.count(request).await?;
        Ok(response.result.map_or(0, |r| r.count as usize))
    }

    async fn flush(&self) -> Result<(), RetrieveError> {
        Ok(())
    }
}
