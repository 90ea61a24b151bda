//! `aptix-bench retrieval`: see the parent module.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;

use super::{Percentiles, RetrievalBenchArgs};
use aptix::config::Settings;
use aptix::contracts::{ScopeCondition, ScopeOperator};
use aptix::index::{index_repository, walk, IndexOptions};
use aptix::retrieve::{Retrieval, SearchRequest};

const COLLECTION: &str = "bench";
const REPO: &str = "registry-sample";

/// One timed query: text and the directory of the file it came from, for the filtered run.
struct Probe {
    text: String,
    dir: String,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: RetrievalBenchArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let source = match args.source.clone() {
        Some(s) => s,
        None => aptix::cli::eval_retrieval::registry_sources()
            .into_iter()
            .next()
            .context("no cargo registry sources; pass --source")?,
    };
    let temp = std::env::temp_dir().join(format!("aptix-bench-{}", std::process::id()));
    let mut settings = settings.clone();
    settings.vector.url = None;
    settings.vector.embeddings_url = None;
    settings.vector.data_dir = args.data_dir.clone().unwrap_or_else(|| temp.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(bench(&args, &settings, &source));
    if args.data_dir.is_none() {
        // Best effort: a leftover temp directory is harmless.
        let _ = std::fs::remove_dir_all(&temp);
    }
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn bench(
    args: &RetrievalBenchArgs,
    settings: &Settings,
    source: &Path,
) -> anyhow::Result<()> {
    println!(
        "retrieval benchmark: embedded Qdrant Edge, BM25, target {} chunks from {}",
        args.chunks,
        source.display()
    );
    // The corpus: whole files of the source's repositories (crates), copied into one tree until
    // it chunks into the target size, so the timed part is one `aptix index` of a large repo.
    let corpus = settings.vector.data_dir.join("corpus");
    let (files, crates) = copy_corpus(source, &corpus, args.chunks)?;

    let retrieval = Retrieval::from_settings(settings)?;
    let mut opts = IndexOptions::new(&corpus, REPO);
    opts.progress = false;
    let started = Instant::now();
    let summary = index_repository(&retrieval, COLLECTION, &opts).await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "indexing: {} chunks from {} files ({files} copied from {crates} crates) in {secs:.1} s, {:.0} chunks/s (walk + read + chunk + BM25 + write + flush + optimise)",
        summary.written,
        summary.files,
        summary.written as f64 / secs.max(1e-9)
    );
    drop(retrieval);

    // Queries against the reopened shard, as a restarted worker would see it.
    let started = Instant::now();
    let retrieval = Retrieval::from_settings(settings)?;
    let store = retrieval.store(COLLECTION).await?;
    println!(
        "reopen: {:.2} s, {} points",
        started.elapsed().as_secs_f64(),
        store.count(Default::default()).await?
    );
    let probes = probes(&corpus, args.queries)?;
    for filtered in [false, true] {
        let mut samples = Vec::with_capacity(probes.len());
        let mut returned = 0usize;
        for (i, p) in probes.iter().enumerate() {
            let scope =
                [ScopeCondition::new("path".into(), ScopeOperator::Contains, vec![p.dir.clone()])];
            let request = SearchRequest {
                collection: COLLECTION,
                query_text: &p.text,
                repo: filtered.then_some(REPO),
                scope: if filtered { &scope } else { &[] },
                top_k: 8,
                budget_chars: 24_000,
            };
            let start = Instant::now();
            let outcome = retrieval.search(request).await?;
            // The first few queries warm caches; they are not counted.
            if i >= probes.len().min(20) / 2 {
                samples.push(start.elapsed());
            }
            returned += outcome.chunks.len();
        }
        report(
            if filtered { "query, repo + path filter" } else { "query, unfiltered" },
            &mut samples,
            returned,
            probes.len(),
        );
    }
    for &c in &args.concurrency {
        concurrent(&retrieval, &probes, c.max(1)).await?;
    }
    Ok(())
}

/// What one retrieve process sustains on the embedded store: every probe once, `c` at a time
/// (unfiltered), queries/s and latency under that load.
async fn concurrent(retrieval: &Retrieval, probes: &[Probe], c: usize) -> anyhow::Result<()> {
    use futures_util::StreamExt as _;
    let started = Instant::now();
    let timed = futures_util::stream::iter(probes.iter().map(|p| async move {
        let request = SearchRequest {
            collection: COLLECTION,
            query_text: &p.text,
            repo: None,
            scope: &[],
            top_k: 8,
            budget_chars: 24_000,
        };
        let start = Instant::now();
        retrieval.search(request).await.map(|o| (start.elapsed(), o.chunks.len()))
    }))
    .buffer_unordered(c)
    .collect::<Vec<_>>()
    .await;
    let secs = started.elapsed().as_secs_f64();
    let mut samples = Vec::with_capacity(timed.len());
    let mut returned = 0;
    for t in timed {
        let (d, n) = t?;
        samples.push(d);
        returned += n;
    }
    let rate = samples.len() as f64 / secs.max(1e-9);
    println!("concurrency {c}: {rate:.0} queries/s");
    report(&format!("query, {c} in flight"), &mut samples, returned, probes.len());
    Ok(())
}

fn report(label: &str, samples: &mut [Duration], returned: usize, queries: usize) {
    let p = Percentiles::of(samples);
    println!(
        "{label}: {} timed, p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {:.1} chunks/query",
        samples.len(),
        p.p50,
        p.p95,
        p.p99,
        p.max,
        returned as f64 / queries.max(1) as f64
    );
}

/// Copies indexable files of `source`'s subdirectories (sorted) into `corpus` until they chunk
/// into `want` chunks; returns the files and crates copied.
fn copy_corpus(source: &Path, corpus: &Path, want: usize) -> anyhow::Result<(usize, usize)> {
    let mut crates: Vec<PathBuf> =
        std::fs::read_dir(source)?.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    crates.sort();
    let params = aptix::index::ChunkParams::default();
    let (mut chunks, mut files, mut used) = (0usize, 0usize, 0usize);
    for dir in crates {
        if chunks >= want {
            break;
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (paths, _) = walk::collect(&dir, 512 * 1024)?;
        used += 1;
        for path in paths {
            let Ok(file) = walk::read(&dir, &path) else { continue };
            let target = corpus.join(&name).join(&file.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, &file.text)?;
            chunks += aptix::index::chunk_text(&file.text, &params).len();
            files += 1;
            if chunks >= want {
                break;
            }
        }
    }
    anyhow::ensure!(chunks > 0, "no indexable files under {}", source.display());
    Ok((files, used))
}

/// `n` queries of 2-4 identifiers taken from random lines of random corpus files (seeded).
fn probes(corpus: &Path, n: usize) -> anyhow::Result<Vec<Probe>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_260_501);
    let (mut files, _) = walk::collect(corpus, 512 * 1024)?;
    files.shuffle(&mut rng);
    let mut out = Vec::with_capacity(n);
    for path in files.iter().cycle().take(n * 20) {
        if out.len() == n {
            break;
        }
        let Ok(file) = walk::read(corpus, path) else { continue };
        let lines: Vec<&str> = file.text.lines().collect();
        let Some(line) = lines.choose(&mut rng) else { continue };
        let words: Vec<&str> = line
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| w.len() >= 4)
            .collect();
        if words.len() < 2 {
            continue;
        }
        let text = words.iter().take(4).copied().collect::<Vec<_>>().join(" ");
        let dir = file.path.rsplit_once('/').map_or(file.path.as_str(), |(d, _)| d).to_owned();
        out.push(Probe { text, dir });
    }
    anyhow::ensure!(!out.is_empty(), "could not draw queries from the corpus");
    Ok(out)
}
