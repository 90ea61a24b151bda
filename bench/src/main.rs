//! `aptix-bench ...` (`cargo run --release -p aptix-bench -- ...`): benchmarks, not timed tests,
//! built on the `aptix` library's public API only. Each kind is a [`BenchCommand`] variant;
//! `docs/benchmarks.md` has the figures and how they were measured.
//!
//! `aptix-bench retrieval` measures the embedded store on real code: it copies whole source files
//! of the local cargo registry's crates into one tree until that tree chunks into `--chunks`
//! chunks, times one run of the real indexer over it (chunks/s over walking, reading, chunking,
//! BM25 encoding, writing, flushing and optimising), reopens the shard as a restarted worker would,
//! and times `Retrieval::search` (top-k 8, 24,000-character budget, as the retrieve stage runs it)
//! for queries drawn from the corpus, unfiltered and with a repo + path-contains filter.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use aptix::config::Settings;

mod pipeline;
mod retrieval;

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "aptix-bench", about = "Aptix benchmarks (figures in docs/benchmarks.md)")]
struct Cli {
    /// Configuration file (else APTIX_CONFIG, else built-in defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = aptix::worker::load_settings(cli.config.as_deref(), None)
        .and_then(|s| run(cli.command, &s));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Indexing throughput and query latency of the embedded vector store.
    Retrieval(RetrievalBenchArgs),
    /// Relay through five durable queues (the broker's ceiling) vs the real pipeline, side by
    /// side: turns/s of both and the ratio.
    Ceiling(pipeline::CeilingArgs),
    /// Overhead per turn (publish to final reply, minus the LLM call) at a steady open-loop rate.
    Overhead(pipeline::OverheadArgs),
    /// In-flight capacity: many concurrent turns at high LLM latency; throughput and peak RSS.
    Inflight(pipeline::InflightArgs),
    /// Throughput with 1, 2 and 4 copies of the slowest stage.
    Scaling(pipeline::ScalingArgs),
    /// Cost per turn as the work grows: 100 to 10,000 sessions, 1 KB vs 100 KB active files.
    Growth(pipeline::GrowthArgs),
    /// One tenant's flood (10x its limit) against another's steady load: the second's latency
    /// and throughput with and without it.
    Fairness(pipeline::fairness::FairnessArgs),
    /// The share of input tokens the provider's prompt cache serves, with a `prompt_cache_key`
    /// per session and without one.
    Cache(pipeline::cache::CacheArgs),
    /// The four pipeline benchmarks (ceiling, overhead, inflight, scaling) with their defaults.
    All(pipeline::AllArgs),
}

/// Options of `aptix-bench retrieval`.
#[derive(Debug, clap::Args)]
pub struct RetrievalBenchArgs {
    /// Chunks to index.
    #[arg(long, default_value_t = 100_000)]
    pub chunks: usize,
    /// Queries to time (each kind).
    #[arg(long, default_value_t = 1_000)]
    pub queries: usize,
    /// Directory whose subdirectories are the repositories (default: the cargo registry's sources).
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Store directory (default: a temporary one, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Queries in flight at once in the concurrent runs (one process, one shard), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub concurrency: Vec<usize>,
}

/// Runs a benchmark on its own runtime and prints its figures.
pub fn run(command: BenchCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Retrieval(args) => retrieval::run(args, settings),
        BenchCommand::Ceiling(args) => pipeline::run(pipeline::Which::Ceiling(args), settings),
        BenchCommand::Overhead(args) => pipeline::run(pipeline::Which::Overhead(args), settings),
        BenchCommand::Inflight(args) => pipeline::run(pipeline::Which::Inflight(args), settings),
        BenchCommand::Scaling(args) => pipeline::run(pipeline::Which::Scaling(args), settings),
        BenchCommand::Growth(args) => pipeline::run(pipeline::Which::Growth(args), settings),
        BenchCommand::Fairness(args) => pipeline::run_fairness(args, settings),
        BenchCommand::Cache(args) => pipeline::run_cache(args, settings),
        BenchCommand::All(args) => pipeline::run(pipeline::Which::All(args), settings),
    }
}

/// Latency percentiles of a sample, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples`.
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        samples.sort();
        let at = |q: f64| {
            let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len().max(1)) - 1;
            samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        Percentiles { p50: at(0.50), p95: at(0.95), p99: at(0.99), max: at(1.0) }
    }
}
