//! The embedded backend: one on-disk Qdrant Edge shard per collection.
//!
//! Multi-process policy: Qdrant Edge takes an exclusive `flock` on the shard's WAL, so exactly one
//! process may open a shard (even read-only opening is refused). Within that process the shard is
//! opened once and shared: [`EdgeStore::open`] returns the same handle for the same directory.
//! Stage workers that retrieve from the embedded store therefore run as one process (the
//! all-in-one worker, or a single retrieve worker with concurrency); scaling retrieval across
//! processes means a Qdrant server (`vector.url`). `aptix index` needs the shard too: run it while
//! the worker is stopped, or index into a server.
//!
//! Qdrant Edge is synchronous: every call runs on tokio's blocking pool, at most as many at once
//! as the machine has cores ([`calls`]). They are CPU work, and each blocking thread more keeps
//! allocator pages of its own: under the in-flight benchmark, 21 of the process's 34 threads were
//! searches waiting for a core. Writes and `flush` are serialised by a mutex (Edge's `flush`
//! panics if it races a write); queries run concurrently.
//! `load` does not replay the WAL, so unflushed writes are lost on a crash: deletes flush at once,
//! upserts at least every [`FLUSH_EVERY`] points (a flush costs 0.1–0.4 s), and [`VectorStore::flush`]
//! and dropping the last handle flush the rest. The indexer is idempotent, so a crash between
//! flushes only means the next run writes those chunks again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use async_trait::async_trait;
use qdrant_edge::{
    CountRequest, CreateIndex, Distance, EdgeConfig, EdgeOptimizersConfig, EdgeShard,
    EdgeSparseVectorParamsBuilder, EdgeVectorParamsBuilder, FieldIndexOperations, Modifier,
    PayloadFieldSchema, PayloadSchemaType, PointId, PointInsertOperations, PointOperations,
    ScrollRequest, UpdateOperation,
};

use super::edge_ops;
use super::filter::{self, FilterSpec};
use super::payload::INDEXED_KEYWORD_FIELDS;
use super::select::Selection;
use super::store::{ChunkPoint, Selected, StoreQuery, StoredChunk, VectorStore};
use super::{RetrieveError, DENSE_VECTOR, SPARSE_VECTOR};
use crate::chunk::Chunk;

/// Points per upsert operation: the spike's batch size, large enough to amortise the WAL write.
const UPSERT_BATCH: usize = 500;
/// Most upserted points left unflushed.
pub const FLUSH_EVERY: usize = 10_000;
/// Upserted points after which the shard is optimised. Edge has no background optimiser, so
/// without this every point lands in one appendable segment whose mutable sparse index makes
/// each upsert slower as it grows (the spike: 4,900 points/s for the first 5k, 1,370 for the
/// last 5k of 20k). Optimising turns it into an immutable inverted index, which is also faster
/// to query.
pub const OPTIMIZE_EVERY: usize = 20_000;
/// Segments the merge optimiser aims for. Its default on 2 CPUs re-merges the growing
/// immutable segment after every optimisation, rewriting all points each time.
const SEGMENT_NUMBER: usize = 8;

/// An embedded collection. Clones share the one open shard.
#[derive(Debug, Clone)]
pub struct EdgeStore {
    collection: String,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    shard: EdgeShard,
    /// Serialises writes and flushes; counts upserted points not yet flushed / optimised.
    writes: Mutex<Pending>,
    dense: Option<usize>,
}

/// Edge calls running at once in this process: one per core.
fn calls() -> &'static tokio::sync::Semaphore {
    static CALLS: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    CALLS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

/// Shards open in this process, by canonical directory.
fn open_shards() -> &'static Mutex<HashMap<PathBuf, Weak<Inner>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Inner>>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

impl EdgeStore {
    /// Opens (or creates) the shard of `collection` under `data_dir`, once per process.
    /// `dense` is the dense dimension to create a new collection with; an existing collection
    /// keeps its own layout. Blocking: call from a blocking context or use [`Self::open_async`].
    pub fn open(
        data_dir: &Path,
        collection: &str,
        dense: Option<usize>,
    ) -> Result<Self, RetrieveError> {
        let dir = data_dir.join(collection);
        std::fs::create_dir_all(&dir).map_err(|e| RetrieveError::storage(&dir, e))?;
        let key = dir.canonicalize().map_err(|e| RetrieveError::storage(&dir, e))?;
        let mut open = open_shards().lock().map_err(|e| RetrieveError::Task(e.to_string()))?;
        if let Some(inner) = open.get(&key).and_then(Weak::upgrade) {
            return Ok(EdgeStore { collection: collection.to_owned(), inner });
        }
        let inner = Arc::new(open_shard(&key, dense)?);
        open.insert(key, Arc::downgrade(&inner));
        Ok(EdgeStore { collection: collection.to_owned(), inner })
    }

    /// [`Self::open`] on the blocking pool.
    pub async fn open_async(
        data_dir: PathBuf,
        collection: String,
        dense: Option<usize>,
    ) -> Result<Self, RetrieveError> {
        tokio::task::spawn_blocking(move || EdgeStore::open(&data_dir, &collection, dense)).await?
    }

    /// The shard directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, RetrieveError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, RetrieveError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let _turn = calls().acquire().await.map_err(|e| RetrieveError::Task(e.to_string()))?;
        tokio::task::spawn_blocking(move || f(&inner)).await?
    }
}

fn open_shard(path: &Path, dense: Option<usize>) -> Result<Inner, RetrieveError> {
    let existing = path.join("edge_config.json").exists();
    let result = if existing {
        EdgeShard::load(path, None)
    } else {
        let mut config = EdgeConfig::builder().sparse_vector(
            SPARSE_VECTOR,
            EdgeSparseVectorParamsBuilder::new().modifier(Modifier::Idf).build(),
        );
        if let Some(dim) = dense {
            config = config
                .vector(DENSE_VECTOR, EdgeVectorParamsBuilder::new(dim, Distance::Cosine).build());
        }
        EdgeShard::new(path, config.build())
    };
    let shard = result.map_err(|e| {
        let msg = e.to_string();
        if msg.contains("temporarily unavailable")
            || msg.contains("WouldBlock")
            || msg.contains("would block")
        {
            RetrieveError::Locked { path: path.to_path_buf() }
        } else {
            RetrieveError::storage(path, msg)
        }
    })?;
    let optimizers =
        EdgeOptimizersConfig { default_segment_number: Some(SEGMENT_NUMBER), ..Default::default() };
    shard.set_optimizers_config(optimizers).map_err(|e| RetrieveError::storage(path, e))?;
    let stored_dense = shard.config().vectors.get(DENSE_VECTOR).map(|v| v.size);
    if let (Some(want), Some(have)) = (dense, stored_dense) {
        if want != have {
            return Err(RetrieveError::Incompatible {
                collection: path.display().to_string(),
                message: format!("dense vectors have dimension {have}, configuration says {want}"),
            });
        }
    }
    if dense.is_some() && stored_dense.is_none() {
        tracing::warn!(path = %path.display(), "collection has no dense vectors; retrieval stays BM25-only until it is re-created");
    }
    if !existing {
        for field in INDEXED_KEYWORD_FIELDS {
            let field_name = field
                .parse()
                .map_err(|_| RetrieveError::Config(format!("bad payload path {field}")))?;
            let op = FieldIndexOperations::CreateIndex(CreateIndex {
                field_name,
                field_schema: Some(PayloadFieldSchema::FieldType(PayloadSchemaType::Keyword)),
            });
            shard
                .update(UpdateOperation::FieldIndexOperation(op))
                .map_err(|e| RetrieveError::storage(path, e))?;
        }
        shard.flush();
    }
    tracing::debug!(path = %path.display(), existing, dense = ?stored_dense, "embedded shard opened");
    Ok(Inner {
        path: path.to_path_buf(),
        shard,
        writes: Mutex::new(Pending::default()),
        dense: stored_dense,
    })
}

/// Upserted points since the last flush and the last optimisation.
#[derive(Debug, Default)]
struct Pending {
    unflushed: usize,
    unoptimized: usize,
}

impl Inner {
    /// Applies `ops`; flushes when `upserted` pushes the unflushed count past [`FLUSH_EVERY`],
    /// or always when `upserted` is `None` (deletes and explicit flushes), and optimises past
    /// [`OPTIMIZE_EVERY`] or on an explicit flush after upserts.
    fn write(
        &self,
        ops: Vec<UpdateOperation>,
        upserted: Option<usize>,
    ) -> Result<(), RetrieveError> {
        let mut pending = self.writes.lock().map_err(|e| RetrieveError::Task(e.to_string()))?;
        for op in ops {
            self.shard.update(op).map_err(|e| RetrieveError::storage(&self.path, e))?;
        }
        let n = upserted.unwrap_or(0);
        pending.unflushed += n;
        pending.unoptimized += n;
        let explicit = upserted.is_none();
        if explicit || pending.unflushed >= FLUSH_EVERY {
            self.shard.flush();
            pending.unflushed = 0;
        }
        if pending.unoptimized >= OPTIMIZE_EVERY || (explicit && pending.unoptimized > 0) {
            let started = std::time::Instant::now();
            self.shard.optimize().map_err(|e| RetrieveError::storage(&self.path, e))?;
            self.shard.flush();
            pending.unoptimized = 0;
            tracing::debug!(path = %self.path.display(), ms = started.elapsed().as_millis() as u64, "embedded shard optimised");
        }
        Ok(())
    }
}

#[async_trait]
impl VectorStore for EdgeStore {
    fn collection(&self) -> &str {
        &self.collection
    }

    fn dense_dimension(&self) -> Option<usize> {
        self.inner.dense
    }

    async fn query(&self, query: StoreQuery) -> Result<Vec<Chunk>, RetrieveError> {
        let dense_ok = self.inner.dense.is_some();
        self.blocking(move |inner| {
            let request = edge_ops::query_request(&query, dense_ok, true)?;
            let hits =
                inner.shard.query(request).map_err(|e| RetrieveError::storage(&inner.path, e))?;
            hits.into_iter()
                .map(|p| edge_ops::scored_chunk(p.payload, p.score, &inner.path))
                .collect()
        })
        .await
    }

    async fn query_selected(
        &self,
        query: StoreQuery,
        top_k: usize,
        budget_chars: usize,
    ) -> Result<Selected, RetrieveError> {
        let dense_ok = self.inner.dense.is_some();
        self.blocking(move |inner| {
            let request = edge_ops::query_request(&query, dense_ok, false)?;
            let hits =
                inner.shard.query(request).map_err(|e| RetrieveError::storage(&inner.path, e))?;
            let found = hits.len();
            let mut selection = Selection::new(top_k, budget_chars);
            edge_ops::fill_selection(&inner.shard, hits, &mut selection, &inner.path)?;
            Ok(Selected { chunks: selection.into_chunks(), found })
        })
        .await
    }

    async fn upsert(&self, points: Vec<ChunkPoint>) -> Result<(), RetrieveError> {
        let dense_ok = self.inner.dense.is_some();
        let n = points.len();
        self.blocking(move |inner| {
            let mut ops = Vec::new();
            let mut batch = Vec::with_capacity(UPSERT_BATCH.min(points.len()));
            for p in points {
                batch.push(edge_ops::point(p, dense_ok)?);
                if batch.len() == UPSERT_BATCH {
                    ops.push(upsert_op(std::mem::take(&mut batch)));
                }
            }
            if !batch.is_empty() {
                ops.push(upsert_op(batch));
            }
            inner.write(ops, Some(n))
        })
        .await
    }

    async fn delete(&self, chunk_ids: Vec<String>) -> Result<(), RetrieveError> {
        if chunk_ids.is_empty() {
            return Ok(());
        }
        self.blocking(move |inner| {
            let ids = chunk_ids
                .iter()
                .map(|id| edge_ops::point_id(id))
                .collect::<Result<Vec<PointId>, _>>()?;
            inner.write(
                vec![UpdateOperation::PointOperation(PointOperations::DeletePoints { ids })],
                None,
            )
        })
        .await
    }

    async fn list(&self, repo: &str) -> Result<HashMap<String, StoredChunk>, RetrieveError> {
        let (spec, _) = filter::build(Some(repo), &[]);
        self.blocking(move |inner| {
            let filter = filter::to_edge(&spec)?;
            let mut out = HashMap::new();
            let mut offset = None;
            loop {
                let request = ScrollRequest {
                    offset,
                    limit: Some(2_000),
                    filter: filter.clone(),
                    with_payload: Some(edge_ops::payload_fields(&["chunk_id", "path"])?),
                    ..Default::default()
                };
                let (records, next) = inner
                    .shard
                    .scroll(request)
                    .map_err(|e| RetrieveError::storage(&inner.path, e))?;
                for r in records {
                    if let Some(stored) = edge_ops::stored_chunk(r.payload) {
                        out.insert(stored.chunk_id.clone(), stored);
                    }
                }
                match next {
                    Some(n) => offset = Some(n),
                    None => return Ok(out),
                }
            }
        })
        .await
    }

    async fn count(&self, spec: FilterSpec) -> Result<usize, RetrieveError> {
        self.blocking(move |inner| {
            let request = CountRequest { filter: filter::to_edge(&spec)?, exact: true };
            inner.shard.count(request).map_err(|e| RetrieveError::storage(&inner.path, e))
        })
        .await
    }

    async fn flush(&self) -> Result<(), RetrieveError> {
        self.blocking(|inner| inner.write(Vec::new(), None)).await
    }
}

fn upsert_op(batch: Vec<qdrant_edge::PointStructPersisted>) -> UpdateOperation {
    UpdateOperation::PointOperation(PointOperations::UpsertPoints(
        PointInsertOperations::PointsList(batch),
    ))
}
