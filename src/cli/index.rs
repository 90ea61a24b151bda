//! `aptix index PATH --repo NAME`: indexes a repository into the vector store, idempotently.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::contracts::ContextId;
use crate::index::{index_repository, IndexOptions};
use crate::retrieve::Retrieval;

/// Options of `aptix index`.
#[derive(Debug, clap::Args)]
pub struct IndexArgs {
    /// Repository root to index.
    pub path: PathBuf,
    /// Repository name stored with every chunk (what requests send as `Repo`).
    #[arg(long)]
    pub repo: String,
    /// Collection to write to; default: the collection of --agent-context.
    #[arg(long)]
    pub collection: Option<String>,
    /// AgentContext whose collection to use; default: `default_agent_context`.
    #[arg(long, value_name = "ID")]
    pub agent_context: Option<String>,
    /// Skip files larger than this many bytes.
    #[arg(long, default_value_t = 512 * 1024)]
    pub max_file_bytes: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The collection named on the command line, or the given (or default) AgentContext's.
pub fn resolve_collection(
    settings: &Settings,
    collection: Option<String>,
    agent: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(c) = collection {
        // The same rule as a configured collection's: this name is a directory of the store.
        anyhow::ensure!(
            crate::config::is_collection_name(&c),
            "--collection `{c}` {}",
            crate::config::COLLECTION_RULE
        );
        return Ok(c);
    }
    let id = agent
        .map(str::parse::<ContextId>)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--agent-context: {e}"))?;
    let ctx = settings
        .agent_context(id.as_ref())
        .context("no such agent context in the configuration")?;
    Ok(ctx.collection.clone())
}

/// Runs the indexer on its own runtime and prints the summary.
pub fn run(args: IndexArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let collection = resolve_collection(settings, args.collection, args.agent_context.as_deref())?;
    let retrieval = Retrieval::from_settings(settings)?;
    let mut opts = IndexOptions::new(&args.path, args.repo);
    opts.max_file_bytes = args.max_file_bytes;
    opts.progress = !args.quiet;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(index_repository(&retrieval, &collection, &opts))?;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}
