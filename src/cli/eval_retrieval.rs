//! `aptix eval-retrieval QUERIES.jsonl`: indexes a source tree, runs a query set against it and
//! reports recall@k and MRR. The shipped set (`eval/tokio.jsonl`) is over the `tokio` crate's
//! source in the local cargo registry (`--crate tokio`), which every build of this project has.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::index::{index_repository, IndexOptions};
use crate::retrieve::eval::{evaluate, parse_queries, EvalReport};
use crate::retrieve::Retrieval;

/// Options of `aptix eval-retrieval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Query set, JSONL: {"query", "repo", "expected_paths"}.
    pub queries: PathBuf,
    /// Source tree to index and query.
    #[arg(long, conflicts_with = "krate", required_unless_present = "krate")]
    pub source: Option<PathBuf>,
    /// Index a crate from the local cargo registry (newest version found), e.g. `tokio`.
    #[arg(long = "crate", value_name = "NAME")]
    pub krate: Option<String>,
    /// Repository name to index under; default: the first query's `repo`.
    #[arg(long)]
    pub repo: Option<String>,
    /// Cut-off for recall@k and MRR.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Collection to index into.
    #[arg(long, default_value = "eval-retrieval")]
    pub collection: String,
    /// Embedded store directory to keep (default: a temporary one, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print the report as JSON (per-query results included).
    #[arg(long)]
    pub json: bool,
}

/// The local cargo registry's source directories (`$CARGO_HOME/registry/src/*`).
pub fn registry_sources() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let Some(home) = home else { return Vec::new() };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The newest `NAME-VERSION` directory of a crate in the local cargo registry.
pub fn registry_crate(name: &str) -> Option<PathBuf> {
    let prefix = format!("{name}-");
    let mut found: Vec<(Vec<u64>, PathBuf)> = Vec::new();
    for index in registry_sources() {
        for dir in std::fs::read_dir(index).into_iter().flatten().flatten() {
            let file_name = dir.file_name().to_string_lossy().into_owned();
            let Some(version) = file_name.strip_prefix(&prefix) else { continue };
            let parts: Option<Vec<u64>> = version.split('.').map(|p| p.parse().ok()).collect();
            if let Some(parts) = parts {
                found.push((parts, dir.path()));
            }
        }
    }
    found.into_iter().max().map(|(_, p)| p)
}

/// Indexes, evaluates and prints; exit 0.
pub fn run(args: EvalArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.queries)
        .with_context(|| format!("reading {}", args.queries.display()))?;
    let queries =
        parse_queries(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.queries.display()))?;
    let source = match (&args.source, &args.krate) {
        (Some(s), _) => s.clone(),
        (None, Some(name)) => registry_crate(name)
            .with_context(|| format!("crate `{name}` is not in the local cargo registry"))?,
        (None, None) => anyhow::bail!("give --source PATH or --crate NAME"),
    };
    let repo = args
        .repo
        .clone()
        .or_else(|| queries.iter().find_map(|q| q.repo.clone()))
        .unwrap_or_else(|| "eval".to_owned());
    let temp = std::env::temp_dir().join(format!("aptix-eval-{}", std::process::id()));
    let mut settings = settings.clone();
    settings.vector.data_dir = args.data_dir.clone().unwrap_or_else(|| temp.clone());
    let report = {
        let retrieval = Retrieval::from_settings(&settings)?;
        let mut opts = IndexOptions::new(&source, repo);
        opts.progress = !args.json;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async {
            let summary = index_repository(&retrieval, &args.collection, &opts).await?;
            eprintln!("corpus {}:\n{summary}", source.display());
            anyhow::Ok(evaluate(&retrieval, &args.collection, &queries, args.k).await?)
        })?
    };
    if args.data_dir.is_none() {
        // Best effort: a leftover temp directory is harmless.
        let _ = std::fs::remove_dir_all(&temp);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &EvalReport) {
    for q in &r.results {
        let rank = q.first_hit.map_or("-".to_owned(), |h| h.to_string());
        println!("{rank:>3}  recall {:.2}  {}", q.recall, q.query);
    }
    println!(
        "queries {}  recall@{k} {:.3}  MRR@{k} {:.3}  hit@{k} {:.3}",
        r.queries,
        r.recall_at_k,
        r.mrr,
        r.hit_rate,
        k = r.k
    );
}
