//! The repository indexer behind `aptix index PATH --repo NAME`.
//!
//! Walks the tree ([`walk`]), detects each file's language ([`language`]), chunks it along layout
//! boundaries with exact line spans ([`chunker`]), and writes chunks with their BM25 (and, when
//! configured, dense) vectors to the AgentContext's collection. Chunk ids derive from repo, path,
//! span and content, so indexing is idempotent: chunks already stored are neither re-encoded nor
//! rewritten, and stored chunks of this repo that the tree no longer produces (changed or deleted
//! files) are deleted.

pub mod chunker;
pub mod language;
mod prepare;
mod sample;
pub mod syntax;
pub mod walk;

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::retrieve::{ChunkPoint, Retrieval, RetrieveError, VectorStore};
pub use chunker::{chunk_text, ChunkParams, TextChunk};
pub use sample::write_sample_repo;
pub use syntax::chunk_file;
pub use walk::SkipReason;

/// Files chunked and encoded per blocking task.
const FILES_PER_TASK: usize = 32;
/// Points handed to the store per write.
const POINTS_PER_WRITE: usize = 2_000;

/// Why indexing failed.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The path to index is not a directory.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// Walking the tree failed.
    #[error("walking the tree failed: {0}")]
    Walk(String),
    /// The vector store or embedder failed.
    #[error(transparent)]
    Store(#[from] RetrieveError),
}

/// What to index and how.
#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Repository root.
    pub root: PathBuf,
    /// Repository name stored as `repo` (what requests put in `Repo`).
    pub repo: String,
    /// Files larger than this are skipped.
    pub max_file_bytes: u64,
    /// Chunking parameters.
    pub chunking: ChunkParams,
    /// Show a progress bar (drawn only when stderr is a terminal).
    pub progress: bool,
}

impl IndexOptions {
    /// Defaults: 512 KiB file limit, default chunking, progress bar on.
    pub fn new(root: impl Into<PathBuf>, repo: impl Into<String>) -> Self {
        IndexOptions {
            root: root.into(),
            repo: repo.into(),
            max_file_bytes: 512 * 1024,
            chunking: ChunkParams::default(),
            progress: true,
        }
    }
}

/// What an indexing run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexSummary {
    /// Files chunked.
    pub files: usize,
    /// Chunks the tree produced.
    pub chunks: usize,
    /// Chunks written (new or changed).
    pub written: usize,
    /// Chunks already stored, left untouched.
    pub unchanged: usize,
    /// Stored chunks removed (changed or deleted files).
    pub deleted: usize,
    /// Files not indexed, by reason (relative paths).
    pub skipped: walk::Skipped,
    /// Wall time.
    pub elapsed: Duration,
}

impl fmt::Display for IndexSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        writeln!(f, "indexed {} files into {} chunks in {secs:.1} s", self.files, self.chunks)?;
        write!(
            f,
            "chunks: {} written, {} unchanged, {} deleted",
            self.written, self.unchanged, self.deleted
        )?;
        if secs > 0.0 && self.written > 0 {
            write!(f, " ({:.0} written/s)", self.written as f64 / secs)?;
        }
        let skipped: usize = self.skipped.values().map(Vec::len).sum();
        write!(f, "\nskipped {skipped} files")?;
        for (reason, paths) in &self.skipped {
            write!(f, "\n  {reason}: {}", paths.len())?;
            for p in paths.iter().take(3) {
                write!(f, "\n    {p}")?;
            }
        }
        Ok(())
    }
}

/// Indexes `opts.root` as repository `opts.repo` into `collection`.
pub async fn index_repository(
    retrieval: &Retrieval,
    collection: &str,
    opts: &IndexOptions,
) -> Result<IndexSummary, IndexError> {
    let started = Instant::now();
    let store = retrieval.store(collection).await?;
    let (root, max) = (opts.root.clone(), opts.max_file_bytes);
    let (files, skipped) = tokio::task::spawn_blocking(move || walk::collect(&root, max))
        .await
        .map_err(RetrieveError::from)??;
    let existing = Arc::new(store.list(&opts.repo).await?);
    let embed = retrieval.embedder().filter(|_| store.dense_dimension().is_some());
    tracing::info!(repo = %opts.repo, collection, files = files.len(), stored = existing.len(), dense = embed.is_some(), "indexing");

    let bar = progress_bar(files.len(), opts.progress);
    let mut summary = IndexSummary { skipped, ..Default::default() };
    let mut seen: HashSet<String> = HashSet::new();
    let mut buffer: Vec<ChunkPoint> = Vec::new();
    let mut writing: Option<tokio::task::JoinHandle<Result<(), RetrieveError>>> = None;
    let ctx = Arc::new(prepare::Context {
        root: opts.root.clone(),
        repo: opts.repo.clone(),
        params: opts.chunking,
        encoder: retrieval.encoder().clone(),
        existing: Arc::clone(&existing),
    });
    for group in files.chunks(FILES_PER_TASK) {
        let (ctx, group, n) = (Arc::clone(&ctx), group.to_vec(), group.len() as u64);
        let batch = tokio::task::spawn_blocking(move || prepare::prepare(&ctx, &group))
            .await
            .map_err(RetrieveError::from)?;
        summary.files += batch.files;
        summary.chunks += batch.chunks;
        summary.unchanged += batch.unchanged.len();
        for (path, reason) in batch.skipped {
            summary.skipped.entry(reason).or_default().push(path);
        }
        seen.extend(batch.unchanged);
        seen.extend(batch.points.iter().map(|p| p.payload.chunk_id.clone()));
        buffer.extend(batch.points);
        bar.inc(n);
        if buffer.len() >= POINTS_PER_WRITE {
            summary.written += buffer.len();
            let points = std::mem::take(&mut buffer);
            writing = Some(write(&store, embed, points, writing.take()).await?);
        }
    }
    summary.written += buffer.len();
    let last = write(&store, embed, std::mem::take(&mut buffer), writing.take()).await?;
    last.await.map_err(RetrieveError::from)??;
    let stale: Vec<String> = existing.keys().filter(|id| !seen.contains(*id)).cloned().collect();
    summary.deleted = stale.len();
    store.delete(stale).await?;
    store.flush().await?;
    bar.finish_and_clear();
    summary.elapsed = started.elapsed();
    tracing::info!(repo = %opts.repo, written = summary.written, unchanged = summary.unchanged, deleted = summary.deleted, "indexing done");
    Ok(summary)
}

/// Embeds (when configured), waits for the previous write, then starts writing `points` in the
/// background so the next files are chunked and encoded while the store works.
async fn write(
    store: &Arc<dyn VectorStore>,
    embed: Option<&crate::retrieve::embed::Embedder>,
    mut points: Vec<ChunkPoint>,
    previous: Option<tokio::task::JoinHandle<Result<(), RetrieveError>>>,
) -> Result<tokio::task::JoinHandle<Result<(), RetrieveError>>, RetrieveError> {
    if let Some(embedder) = embed.filter(|_| !points.is_empty()) {
        let texts: Vec<String> =
            points.iter().map(|p| format!("{}\n{}", p.payload.path, p.payload.text)).collect();
        for (p, v) in points.iter_mut().zip(embedder.embed(&texts).await?) {
            p.dense = Some(v);
        }
    }
    if let Some(previous) = previous {
        previous.await??;
    }
    let store = Arc::clone(store);
    Ok(tokio::spawn(async move {
        if points.is_empty() {
            Ok(())
        } else {
            store.upsert(points).await
        }
    }))
}

fn progress_bar(len: usize, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} files ({eta})",
    ) {
        bar.set_style(style);
    }
    bar
}
