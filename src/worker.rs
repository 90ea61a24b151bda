//! Running stages as a process: `aptix worker <stage>`, `aptix run`, and the per-stage worker
//! binaries. Configuration, telemetry, dependencies, then the stages of the registry
//! ([`crate::stages::chain`]) until SIGINT or SIGTERM.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::broker::StageName;
use crate::config::Settings;
use crate::pipeline;
use crate::telemetry::{self, LogFormat};

/// A worker binary's command line: what `aptix worker <stage>` takes, the stage fixed.
#[derive(Debug, clap::Parser)]
#[command(version, about = "Runs one stage of the Aptix pipeline until SIGINT or SIGTERM.")]
struct WorkerArgs {
    /// Configuration file (default: `APTIX_CONFIG`, then built-in defaults; `APTIX__*`
    /// environment variables override either).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Log format: `pretty` or `json` (default: `telemetry.format`).
    #[arg(long)]
    log_format: Option<LogFormat>,
    /// Consumers of the stage in this process.
    #[arg(long, default_value_t = 1)]
    copies: usize,
}

/// The whole of a worker binary: read its arguments (an unknown one, or `--help`, starts
/// nothing), load configuration, start logging, run stage `name` until SIGTERM.
pub fn main(name: &str) -> ExitCode {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let service = format!("aptix-{name}");
    // The binary's own name in its help and errors (clap takes a name that lives for good).
    let bin: &'static str = Box::leak(service.clone().into_boxed_str());
    let matches = WorkerArgs::command().name(bin).get_matches();
    let args = match WorkerArgs::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let result = load_settings_with(
        args.config.as_deref(),
        args.log_format,
        telemetry::DEFAULT_FILTER,
        &service,
    )
    .and_then(|s| run(s, &[name.to_owned()], args.copies));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The pipeline's stages called `names` (every stage when `names` is empty), after checking
/// that the configuration's per-stage tables name only stages of the pipeline.
pub fn stages(settings: &Settings, names: &[String]) -> anyhow::Result<Vec<StageName>> {
    let chain = crate::stages::chain();
    let all = chain.names();
    let known: Vec<&str> = all.iter().map(|n| n.as_str()).collect();
    settings.check_stage_names(&known)?;
    if names.is_empty() {
        return Ok(all);
    }
    names
        .iter()
        .map(|n| {
            chain.find(n).with_context(|| {
                format!("no stage is called `{n}`; the pipeline has {}", known.join(", "))
            })
        })
        .collect()
}

/// Consumes the stages called `names` (every stage when empty), `copies` consumers each,
/// until SIGINT or SIGTERM.
pub fn run(settings: Settings, names: &[String], copies: usize) -> anyhow::Result<ExitCode> {
    let stages = stages(&settings, names)?;
    let runtime = pipeline_runtime(settings.pipeline.worker_threads)?;
    runtime.block_on(async move {
        let shutdown = pipeline::shutdown_on_signals();
        let deps = pipeline::build_deps_patiently(Arc::new(settings), &shutdown)
            .await
            .context("starting the pipeline")?;
        let Some(deps) = deps else { return Ok(ExitCode::SUCCESS) };
        serve_http(&deps, &shutdown);
        pipeline::prepare(&deps, &stages).await?;
        pipeline::run(Arc::new(deps), &stages, copies, shutdown).await;
        crate::otel::flush().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Serves metrics and health on `telemetry.metrics_listen`, and files there too or on
/// `files.listen`; deletes the files that expired.
fn serve_http(deps: &crate::stages::Deps, shutdown: &CancellationToken) {
    let settings = &deps.settings;
    tokio::spawn(crate::files::sweep(deps.store.clone(), shutdown.clone()));
    let listen = settings.telemetry.metrics_listen.clone();
    if settings.files_listen_is_wildcard() {
        let (at, url) = (settings.files_listen(), settings.files_base_url());
        tracing::warn!(listen = at, %url, "files.base_url is not set and the listener binds every address: file urls name loopback, which only this host reaches");
    }
    let files = crate::files::router(deps.store.clone(), settings.pipeline.keys());
    let (beside_metrics, own) = match settings.files.listen.as_str() {
        "" => (Some(files), None),
        own => (None, Some((own.to_owned(), files))),
    };
    if let Some((at, files)) = own {
        tokio::spawn(crate::files::serve_alone(at, files, shutdown.clone()));
    }
    if !listen.is_empty() {
        let database: Arc<dyn crate::metrics::Ready> = Arc::new(deps.store.clone());
        let serve = crate::metrics::serve(listen, Some(database), beside_metrics, shutdown.clone());
        tokio::spawn(serve);
    }
}

/// Loads and validates settings, then starts logging in the configured format (and trace
/// export as service `aptix` when `telemetry.otlp_endpoint` is set).
pub fn load_settings(path: Option<&Path>, format: Option<LogFormat>) -> anyhow::Result<Settings> {
    load_settings_with(path, format, telemetry::DEFAULT_FILTER, "aptix")
}

/// Like [`load_settings`], logging by `default_filter` when `RUST_LOG` is not set and exporting
/// spans as `service` (`OTEL_SERVICE_NAME` wins when set, as OpenTelemetry's SDKs agree).
pub fn load_settings_with(
    path: Option<&Path>,
    format: Option<LogFormat>,
    default_filter: &str,
    service: &str,
) -> anyhow::Result<Settings> {
    let settings = Settings::load(path)?;
    let endpoint = settings.telemetry.otlp_endpoint.expose();
    let export = (!endpoint.is_empty()).then(|| crate::otel::Export {
        endpoint: endpoint.to_owned(),
        service: std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned()),
    });
    let format = format.unwrap_or(settings.telemetry.format);
    telemetry::init_with(format, default_filter, export.as_ref());
    Ok(settings)
}

/// Runs an async command on a fresh multi-threaded runtime.
pub fn block_on<F: std::future::Future<Output = anyhow::Result<ExitCode>>>(
    f: F,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(f)
}

/// A runtime for a pipeline process (`aptix run`, `aptix worker`, the demo), with
/// [`worker_threads`]`(configured)` async workers. One worker is tokio's current-thread runtime,
/// not a multi-threaded one of one worker (which polls its `block_on` future on a second
/// thread): in flight (1,000 turns at 2 s) it did more turns/s in each of four pairs measured in
/// turn (docs/benchmarks.md, the lever table). lapin's I/O threads connect through
/// `Handle::block_on`, which on this runtime makes progress only while `Runtime::block_on` runs:
/// callers keep the runtime in `block_on` for the pipeline's whole life.
pub fn pipeline_runtime(configured: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match worker_threads(configured) {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
}

/// `pipeline.worker_threads`, or for 0 half the cores and at least one: the stages mostly wait
/// on the broker and the database, and more workers than the process keeps busy mostly wake
/// and steal from each other (measured in docs/benchmarks.md, "Seventh pass").
pub fn worker_threads(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (cores / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::{pipeline_runtime, worker_threads};
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn one_worker_is_the_current_thread_runtime_and_more_are_multi_threaded() {
        let flavor = |n| pipeline_runtime(n).unwrap().handle().runtime_flavor();
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(2), RuntimeFlavor::MultiThread);
        // Spawned tasks and blocking work still run on a current-thread pipeline runtime.
        let rt = pipeline_runtime(1).unwrap();
        let got = rt.block_on(async {
            let spawned = tokio::spawn(async { 20 });
            let blocking = tokio::task::spawn_blocking(|| 22);
            spawned.await.unwrap() + blocking.await.unwrap()
        });
        assert_eq!(got, 42);
    }

    #[test]
    fn worker_threads_are_configured_or_half_the_cores() {
        assert_eq!(worker_threads(3), 3);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = worker_threads(0);
        assert!(auto >= 1 && (cores < 2 || auto <= cores / 2), "{auto} of {cores} cores");
    }
}
