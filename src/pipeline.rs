//! Wiring: builds the shared dependencies once per process and runs stage consumers until the
//! shutdown token fires. Used by `aptix worker`, `aptix run`, the worker binaries, the demo,
//! benchmarks and tests.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::{
    run_partitioned, run_stage, Handler, LazyPublisher, RuntimeSettings, StageName, Topology,
};
use crate::config::Settings;
use crate::llm::{HttpLlmClient, LlmClient};
use crate::retrieve::Retrieval;
use crate::stage::{BrokerDeltas, Chain, DeltaSink};
use crate::stages::Deps;
use crate::store::{Gate, Store};

/// Why the pipeline could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// PostgreSQL.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The LLM client.
    #[error("llm client: {0}")]
    Llm(#[from] crate::llm::LlmError),
    /// The vector store.
    #[error("retrieval: {0}")]
    Retrieve(#[from] crate::retrieve::RetrieveError),
    /// The configuration (read again at start: the message key file).
    #[error("configuration: {0}")]
    Config(crate::config::ConfigError),
    /// The database lacks migrations of this build, and `pipeline.migrate_on_start` is off.
    #[error("the database lacks migrations {0:?} of this build: apply them with `aptix migrate` (the migrate job) before starting its workers, or set pipeline.migrate_on_start")]
    NotMigrated(Vec<i64>),
}

impl StartError {
    /// Whether waiting can mend it: a database that cannot be reached for now, or that lacks
    /// migrations someone else is about to apply.
    fn passes(&self) -> bool {
        match self {
            StartError::Store(e) => e.is_transient(),
            StartError::NotMigrated(_) => true,
            _ => false,
        }
    }
}

/// The queue names configured in `settings`, with the pipeline's stages.
pub fn topology(settings: &Settings) -> Topology {
    Topology::new(&settings.amqp.prefix)
        .with_stages(&crate::stages::names())
        .with_layout(settings.amqp.ingress_partitions, settings.amqp.queue_type)
        .with_stage_partitions(settings.amqp.stage_partitions)
        .draining_stage_partitions(&settings.amqp.draining_stage_partitions)
}

/// Each configured tenant's limits.
pub fn gates(settings: &Settings) -> Vec<Gate> {
    let names = settings.tenant_names().into_iter();
    names.map(|t| Gate { limits: settings.limits_of(Some(&t)), tenant: t }).collect()
}

/// Builds the dependencies every stage shares, using `llm` when given (tests, the demo's
/// simulator) and the configured HTTP client otherwise. Migrates when configured to.
pub async fn build_deps(
    settings: Arc<Settings>,
    llm: Option<Arc<dyn LlmClient>>,
) -> Result<Deps, StartError> {
    let store = Store::connect(settings.database.url.expose(), settings.database.max_connections)?
        .with_tenants(gates(&settings))
        .with_versions(crate::config::ContextVersions::of(&settings));
    if settings.pipeline.migrate_on_start {
        store.migrate_as_worker().await?;
    } else {
        let missing = store.missing_migrations().await?;
        if !missing.is_empty() {
            return Err(StartError::NotMigrated(missing));
        }
    }
    let settings = with_message_key(settings, &store).await?;
    let llm = match llm {
        Some(l) => l,
        None => Arc::new(HttpLlmClient::new(&settings.llm)?),
    };
    crate::metrics::metrics().allow_configured_models(&settings);
    let topology = topology(&settings);
    let publisher = LazyPublisher::new(runtime_settings(&settings, StageName::new("deltas")));
    let window = settings.pipeline.stream_events_per_step;
    let deltas: Arc<dyn DeltaSink> =
        Arc::new(BrokerDeltas::new(publisher, topology.clone(), store.clone(), window));
    Ok(Deps {
        retrieval: Retrieval::from_settings(&settings)?,
        store,
        topology,
        llm,
        deltas: Some(deltas),
        mcp: Arc::new(crate::mcp::Hub::new()),
        settings,
    })
}

/// `settings` with a stage-message key: the configured ones, else the database's.
async fn with_message_key(
    settings: Arc<Settings>,
    store: &Store,
) -> Result<Arc<Settings>, StartError> {
    if !settings.pipeline.message_keys().map_err(StartError::Config)?.is_empty() {
        return Ok(settings);
    }
    let mut own = (*settings).clone();
    own.pipeline.message_key = Some(crate::config::Secret::new(store.message_key().await?));
    Ok(Arc::new(own))
}

/// Like [`build_deps`] with the configured LLM client, for long-running workers: while the
/// database cannot be reached (it may be restarting) or lacks this build's migrations (the
/// migrate job applied beside the workers has not run yet), waits with backoff and tries again
/// instead of exiting, until `shutdown` fires (`Ok(None)`).
pub async fn build_deps_patiently(
    settings: Arc<Settings>,
    shutdown: &CancellationToken,
) -> Result<Option<Deps>, StartError> {
    let mut delay = Duration::from_millis(250);
    loop {
        match build_deps(settings.clone(), None).await {
            Err(error) if error.passes() => {
                warn!(%error, retry_in_ms = delay.as_millis() as u64, "database not ready for this build at start, waiting");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            other => return other.map(Some),
        }
    }
}

/// How `stage` consumes, from configuration.
pub fn runtime_settings(settings: &Settings, stage: StageName) -> RuntimeSettings {
    RuntimeSettings {
        amqp_url: settings.amqp.url.expose().to_owned(),
        topology: topology(settings),
        prefetch: settings.pipeline.prefetch.get(stage.as_str()).max(1),
        max_attempts: settings.pipeline.max_attempts.get(stage.as_str()).max(1),
        max_redeliveries: settings.pipeline.max_redeliveries,
        confirm_timeout: Duration::from_millis(settings.pipeline.confirm_timeout_ms),
        max_message_bytes: settings.amqp.max_message_bytes,
        keys: settings.pipeline.keys(),
    }
}

/// The runtime handler of stage `name` of the pipeline ([`crate::stages::chain`]).
pub fn handler(deps: &Deps, name: StageName) -> Option<Arc<dyn Handler>> {
    crate::stages::chain().handler(name, deps)
}

/// Checks that each of `stages` can run in this process ([`crate::stage::Stage::prepare`]);
/// the error names the stage and why.
pub async fn prepare(deps: &Deps, stages: &[StageName]) -> Result<(), CannotStart> {
    for &stage in stages {
        if let Some(handler) = handler(deps, stage) {
            handler.prepare().await.map_err(|reason| CannotStart { stage, reason })?;
        }
    }
    Ok(())
}

/// A stage that cannot run in this process ([`prepare`]).
#[derive(Debug, thiserror::Error)]
#[error("the {stage} stage cannot start: {reason}")]
pub struct CannotStart {
    /// The stage.
    pub stage: StageName,
    /// Why.
    pub reason: crate::broker::BoxError,
}

/// Runs `copies` consumers of each of `stages` of the pipeline until `shutdown` fires, then
/// waits for them to finish their in-flight messages.
pub async fn run(
    deps: Arc<Deps>,
    stages: &[StageName],
    copies: usize,
    shutdown: CancellationToken,
) {
    run_chain(&crate::stages::chain(), deps, stages, copies, shutdown).await
}

/// Like [`run`], for any chain of stages (a pipeline with a stage of its own, in tests).
pub async fn run_chain(
    chain: &Chain<Deps>,
    deps: Arc<Deps>,
    stages: &[StageName],
    copies: usize,
    shutdown: CancellationToken,
) {
    let mut tasks = Vec::new();
    // Replies a client's queue refused wait in PostgreSQL; every stage process offers them again.
    let redeliver = runtime_settings(&deps.settings, StageName::new("redeliver"));
    let redeliver = crate::redeliver::run(deps.store.clone(), redeliver, shutdown.clone());
    tasks.push(tokio::spawn(redeliver));
    let budgets =
        crate::budgets::watch(deps.settings.clone(), deps.store.clone(), shutdown.clone());
    tasks.push(tokio::spawn(budgets));
    for &stage in stages {
        let Some(handler) = chain.handler(stage, &deps) else {
            warn!(stage = stage.as_str(), "no such stage in the pipeline");
            continue;
        };
        let mut settings = runtime_settings(&deps.settings, stage);
        settings.topology = chain.topology(&deps);
        let ingress = settings.topology.is_ingress(stage);
        if let Some(route) = chain.route(stage, &deps).filter(|_| ingress) {
            let held = runtime_settings(&deps.settings, StageName::new("held"));
            let run = crate::held::run(deps.clone(), route.clone(), held, shutdown.clone());
            tasks.push(tokio::spawn(run));
            let expiry = runtime_settings(&deps.settings, StageName::new("approvals"));
            let run = crate::approvals::run(deps.clone(), route, expiry, shutdown.clone());
            tasks.push(tokio::spawn(run));
        }
        let partitioned = ingress && settings.topology.partitions() > 1;
        for _ in 0..copies.max(1) {
            let (handler, settings, shutdown) =
                (handler.clone(), settings.clone(), shutdown.clone());
            tasks.push(if partitioned {
                let roster: Arc<dyn crate::balance::Roster> = Arc::new(deps.store.clone());
                let group = settings.topology.prefix().to_owned();
                let partitions = settings.topology.partitions();
                let member = crate::balance::member_name();
                let share =
                    crate::balance::spawn(roster, group, member, partitions, shutdown.clone());
                tokio::spawn(run_partitioned(stage, handler, settings, share, shutdown))
            } else {
                tokio::spawn(run_stage(stage, handler, settings, shutdown))
            });
        }
    }
    info!(stages = ?stages.iter().map(|s| s.as_str()).collect::<Vec<_>>(), copies, "pipeline running");
    for task in tasks {
        let _ = task.await;
    }
}

/// A token cancelled by SIGINT or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    // Registered before returning, not in the task: a signal that comes before the task first
    // runs would otherwise find the default action, which kills the process.
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::terminate()).and_then(|t| Ok((t, signal(SignalKind::interrupt())?)))
    };
    tokio::spawn(async move {
        #[cfg(unix)]
        match signals {
            Ok((mut term, mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        info!("shutdown requested, finishing in-flight messages");
        t.cancel();
    });
    token
}
