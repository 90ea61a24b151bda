//! Pipeline benchmarks: `aptix-bench ceiling | overhead | inflight | scaling | growth | all`,
//! and `fairness` and `cache` on their own.
//!
//! Every measured run gets a fresh environment (random queue prefix, new database, simulator,
//! embedded vector store; see `env`), drives turns by publishing real `AgentExecuteRequest`
//! JSON to `<prefix>.requests` and reading the sessions' reply queues (see `driver`), and is
//! torn down afterwards. `--runs N` repeats the whole run N times and reports the median and
//! range of every figure; `--smoke` shrinks every size so CI runs each in seconds.

mod args;
pub mod cache;
mod driver;
mod env;
pub mod fairness;
mod pipeline_process;
mod profile;
mod relay;
mod report;
mod requests;
mod runs;
mod sim_process;
mod sim_thread;
mod sys;
mod timed_llm;

use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::{json, Value};

use aptix::config::Settings;
use report::RunReport;

pub use args::{
    AllArgs, CeilingArgs, CommonArgs, GrowthArgs, InflightArgs, OverheadArgs, ScalingArgs,
};
pub(crate) use args::{Ceiling, Growth, Inflight, Overhead, Scaling};

/// Which benchmark to run.
#[derive(Debug, Clone)]
pub enum Which {
    /// Relay vs pipeline.
    Ceiling(CeilingArgs),
    /// Overhead per turn at a steady rate.
    Overhead(OverheadArgs),
    /// In-flight capacity at high LLM latency.
    Inflight(InflightArgs),
    /// Copies of the slowest stage.
    Scaling(ScalingArgs),
    /// Cost per turn as sessions and active files grow.
    Growth(GrowthArgs),
    /// All four.
    All(AllArgs),
}

/// Runs `aptix-bench fairness` on its own runtime; exit 1 when a turn of B failed.
pub fn run_fairness(args: fairness::FairnessArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let all_ok = runtime.block_on(fairness::run(args, settings))?;
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Runs `aptix-bench cache` on its own runtime; exit 1 when a turn failed.
pub fn run_cache(args: cache::CacheArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let all_ok = runtime.block_on(cache::run(args, settings))?;
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Runs a pipeline benchmark on its own runtime, prints its table, optionally writes JSON.
/// Exit 1 when a turn failed or got no reply (a target missed is reported, not an error).
pub fn run(which: Which, settings: &Settings) -> anyhow::Result<ExitCode> {
    let common = match &which {
        Which::Ceiling(a) => a.common.clone(),
        Which::Overhead(a) => a.common.clone(),
        Which::Inflight(a) => a.common.clone(),
        Which::Scaling(a) => a.common.clone(),
        Which::Growth(a) => a.common.clone(),
        Which::All(a) => a.common.clone(),
    };
    // The pipeline runs in this process with the driver, on the runtime `aptix run` would use.
    let runtime = aptix::worker::pipeline_runtime(settings.pipeline.worker_threads)?;
    let (doc, failures) = runtime.block_on(dispatch(which, &common, settings))?;
    if let Some(path) = &common.json {
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    if failures > 0 {
        eprintln!("{failures} turn(s) ended without a successful final reply");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

async fn dispatch(
    which: Which,
    common: &CommonArgs,
    settings: &Settings,
) -> anyhow::Result<(Value, usize)> {
    let corpus = common.corpus();
    let machine = sys::machine_info();
    let header = |name: &str| {
        println!(
            "aptix-bench {name}: {} run(s), corpus {}, profile {}, {} CPUs",
            common.runs.max(1),
            corpus.describe(),
            machine["profile"].as_str().unwrap_or("?"),
            machine["cpus"]
        );
    };
    let mut docs = serde_json::Map::new();
    let mut failures = 0;
    let mut record = |name: &str, (doc, f): (Value, usize)| {
        failures += f;
        docs.insert(name.to_owned(), doc);
    };
    let smoke_common = || CommonArgs { json: None, ..common.clone() };
    match which {
        Which::Ceiling(a) => {
            header("ceiling");
            record("ceiling", runs::ceiling(&a.resolve(), common, &corpus, settings).await?);
        }
        Which::Overhead(a) => {
            header("overhead");
            record("overhead", runs::overhead(&a.resolve(), common, &corpus, settings).await?);
        }
        Which::Inflight(a) => {
            header("inflight");
            record("inflight", runs::inflight(&a.resolve(), common, &corpus, settings).await?);
        }
        Which::Scaling(a) => {
            header("scaling");
            record("scaling", runs::scaling(&a.resolve(), common, &corpus, settings).await?);
        }
        Which::Growth(a) => {
            header("growth");
            record("growth", runs::growth(&a.resolve(), common, &corpus, settings).await?);
        }
        Which::All(_) => {
            header("all");
            let c = smoke_common();
            let ceiling =
                CeilingArgs { common: c.clone(), secs: None, warmup_secs: None, sessions: None };
            record("ceiling", runs::ceiling(&ceiling.resolve(), common, &corpus, settings).await?);
            let overhead = OverheadArgs {
                common: c.clone(),
                rate: None,
                secs: None,
                warmup_secs: None,
                sessions: None,
            };
            record(
                "overhead",
                runs::overhead(&overhead.resolve(), common, &corpus, settings).await?,
            );
            let inflight = InflightArgs {
                common: c.clone(),
                concurrency: None,
                latency_ms: None,
                secs: None,
                warmup_secs: None,
                pipeline_process: false,
            };
            record(
                "inflight",
                runs::inflight(&inflight.resolve(), common, &corpus, settings).await?,
            );
            let scaling = ScalingArgs {
                common: c,
                stage: None,
                copies: None,
                secs: None,
                warmup_secs: None,
                sessions: None,
                latency_ms: 0,
            };
            record("scaling", runs::scaling(&scaling.resolve(), common, &corpus, settings).await?);
        }
    }
    let doc = json!({
        "machine": machine,
        "corpus": corpus.describe(),
        "runs": common.runs.max(1),
        "smoke": common.smoke,
        "prefetch": settings.pipeline.prefetch,
        "worker_threads": aptix::worker::worker_threads(settings.pipeline.worker_threads),
        "benchmarks": docs,
    });
    Ok((doc, failures))
}

/// Sum of failures of runs.
fn failures(runs: &[RunReport]) -> usize {
    runs.iter().map(|r| r.failures).sum()
}
