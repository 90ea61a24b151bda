//! The CPU half of indexing, run on the blocking pool: read, chunk, and BM25-encode the chunks
//! that are not stored yet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chunker::ChunkParams;
use super::language::language_for;
use super::syntax::chunk_file;
use super::walk::{self, SkipReason};
use crate::retrieve::bm25::Bm25Encoder;
use crate::retrieve::payload::ChunkPayload;
use crate::retrieve::{ChunkPoint, StoredChunk};

/// What every task shares.
#[derive(Debug)]
pub(super) struct Context {
    pub root: PathBuf,
    pub repo: String,
    pub params: ChunkParams,
    pub encoder: Bm25Encoder,
    /// Chunks already stored for this repo, by chunk id.
    pub existing: Arc<HashMap<String, StoredChunk>>,
}

/// The result of one group of files.
#[derive(Debug, Default)]
pub(super) struct Prepared {
    pub files: usize,
    pub chunks: usize,
    /// New or changed chunks, encoded.
    pub points: Vec<ChunkPoint>,
    /// Ids of chunks already stored.
    pub unchanged: Vec<String>,
    pub skipped: Vec<(String, SkipReason)>,
}

pub(super) fn prepare(ctx: &Context, files: &[PathBuf]) -> Prepared {
    let mut out = Prepared::default();
    for path in files {
        match walk::read(&ctx.root, path) {
            Ok(file) => add_file(ctx, path, &file.path, &file.text, &mut out),
            Err(skip) => out.skipped.push(skip),
        }
    }
    out
}

fn add_file(ctx: &Context, abs: &Path, rel: &str, text: &str, out: &mut Prepared) {
    let language = language_for(abs);
    out.files += 1;
    for chunk in chunk_file(abs, text, &ctx.params) {
        out.chunks += 1;
        let payload = ChunkPayload::new(
            &ctx.repo,
            rel,
            chunk.start_line,
            chunk.end_line,
            language,
            chunk.text,
        );
        if ctx.existing.contains_key(&payload.chunk_id) {
            out.unchanged.push(payload.chunk_id);
            continue;
        }
        let sparse = ctx.encoder.document(&payload.path, &payload.text);
        out.points.push(ChunkPoint { payload, sparse, dense: None });
    }
}
