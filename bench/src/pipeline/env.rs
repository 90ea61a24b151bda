//! One benchmark environment, built fresh for every measured run and torn down afterwards:
//! a random queue prefix, a new PostgreSQL database, the Responses simulator in-process (on a
//! thread of its own, see `sim_thread`), an embedded vector store in a temporary directory
//! holding an indexed corpus, and the shared pipeline dependencies. Stages are started with
//! `pipeline::run`, exactly as `aptix run` does, or as `aptix run` itself (`pipeline_process`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use aptix::broker::{connect, Publisher, StageName, Topology, RETRY_TIERS_MS};
use aptix::config::{ConnectionUrl, Settings};
use aptix::contracts::{SessionId, TenantName};
use aptix::index::{index_repository, IndexOptions};
use aptix::llm::{HttpLlmClient, LlmClient};
use aptix::pipeline;
use aptix::sim::{Latency, SimConfig};
use aptix::stages::Deps;
use aptix::store::Store;

use super::pipeline_process::{self as child, PipelineProcess};
use super::sim_process::Simulator;
use super::sys::CpuSources;
use super::timed_llm::TimedLlm;

/// What the vector store holds.
#[derive(Debug, Clone)]
pub enum Corpus {
    /// Three small files (what the integration tests index): seconds to set up, tiny chunks.
    Fixture,
    /// Every indexable file under a directory, as repository `aptix`.
    Dir(PathBuf),
}

impl Corpus {
    /// The default for full runs: the benchmark crate's own sources, `bench/src`, when they are
    /// on disk (about twenty Rust files, so retrieval returns real chunks up to the context's
    /// budget), else the fixture.
    pub fn default_for(smoke: bool) -> Corpus {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        if smoke || !src.is_dir() {
            Corpus::Fixture
        } else {
            Corpus::Dir(src)
        }
    }

    /// For reports.
    pub fn describe(&self) -> String {
        match self {
            Corpus::Fixture => "built-in 3-file fixture".to_owned(),
            Corpus::Dir(p) => p.display().to_string(),
        }
    }
}

/// How to build an environment.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// Indexed corpus.
    pub corpus: Corpus,
    /// Simulator latency.
    pub latency: Latency,
    /// The simulator in a process of its own rather than on a thread.
    pub sim_process: bool,
    /// The pipeline as `aptix run` in a process of its own rather than in this one.
    pub pipeline_process: bool,
}

/// A live benchmark environment.
pub struct BenchEnv {
    /// Random id: the queue prefix is `bench-<id>`, the database `aptix_bench_<id>`.
    pub id: String,
    /// The settings every stage uses.
    pub settings: Arc<Settings>,
    /// Shared stage dependencies.
    pub deps: Arc<Deps>,
    /// Times every LLM call.
    pub llm: Arc<TimedLlm>,
    /// Pipeline queue names.
    pub topology: Topology,
    /// The driver's own connection.
    pub conn: lapin::Connection,
    /// A confirm-mode channel on `conn`.
    pub publisher: Publisher,
    sim: Option<Simulator>,
    dir: PathBuf,
    admin_url: String,
    db_name: String,
    running: Vec<(CancellationToken, JoinHandle<()>)>,
    /// With `pipeline_process`: the vector store the child opens (the embedded store admits one
    /// process), and the child once started.
    child_vectors: Option<PathBuf>,
    child: Option<PipelineProcess>,
    /// Extra topologies (the relay's) and session queues to delete at teardown.
    extra_topologies: Vec<Topology>,
    session_queues: Mutex<Vec<String>>,
}

impl std::fmt::Debug for BenchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchEnv").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Replaces the database name of a PostgreSQL URL (the path), keeping any query string.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let root = match base[after_scheme..].find('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{name}?{q}"),
        None => format!("{root}/{name}"),
    }
}

impl BenchEnv {
    /// Builds an environment from the user's settings (broker and database URLs are taken from
    /// them; everything else is set here). On failure, whatever was created is removed.
    pub async fn setup(base: &Settings, opts: &EnvOptions) -> anyhow::Result<BenchEnv> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let dir = std::env::temp_dir().join(format!("aptix-bench-{id}"));
        std::fs::create_dir_all(&dir)?;
        let db_name = format!("aptix_bench_{id}");
        let admin_url = with_database(base.database.url.expose(), "postgres");
        let result = Self::build(base, opts, &id, &dir, &db_name, &admin_url).await;
        if result.is_err() {
            drop_database(&admin_url, &db_name).await;
            let _ = std::fs::remove_dir_all(&dir);
        }
        result
    }

    async fn build(
        base: &Settings,
        opts: &EnvOptions,
        id: &str,
        dir: &Path,
        db_name: &str,
        admin_url: &str,
    ) -> anyhow::Result<BenchEnv> {
        // No request log (it would hold every body); room for the responses of a long run.
        let sim = Simulator::start(
            SimConfig {
                latency: opts.latency,
                log_capacity: 0,
                // A session's next turn chains to its latest response only; 5,000 covers every load
                // here (at most 1,000 sessions) while keeping the simulator's memory out of the
                // process's peak RSS, which should measure the pipeline.
                store_capacity: 5_000,
                ..SimConfig::default()
            },
            opts.sim_process,
        )
        .await
        .context("starting the simulator")?;
        let mut settings = base.clone();
        settings.amqp.prefix = format!("bench-{id}");
        settings.database.url =
            ConnectionUrl::new(with_database(base.database.url.expose(), db_name));
        settings.llm.base_url = ConnectionUrl::new(sim.base_url());
        // Loopback simulator: never send a real key anywhere.
        settings.llm.api_key = None;
        for agent in settings.agent_contexts.values_mut() {
            agent.llm_base_url = None;
            agent.llm_api_key = None;
        }
        settings.llm.request_timeout_ms = settings.llm.request_timeout_ms.min(60_000);
        settings.vector.url = None;
        settings.vector.embeddings_url = None;
        // With the pipeline apart, its process holds the indexed store; this one an empty one.
        let child_vectors = opts.pipeline_process.then(|| dir.join("vectors"));
        let own_vectors = if opts.pipeline_process { "driver-vectors" } else { "vectors" };
        settings.vector.data_dir = dir.join(own_vectors);
        // Leftovers of an interrupted run disappear on their own after ten minutes.
        settings.pipeline.migrate_on_start = true;
        Store::create_database(settings.database.url.expose())
            .await
            .with_context(|| format!("creating database {db_name} (is PostgreSQL running?)"))?;
        let settings = Arc::new(settings);
        let llm = Arc::new(TimedLlm::new(HttpLlmClient::new(&settings.llm)?));
        let dyn_llm: Arc<dyn LlmClient> = llm.clone();
        let deps = Arc::new(pipeline::build_deps(settings.clone(), Some(dyn_llm)).await?);
        let root = match &opts.corpus {
            Corpus::Dir(p) => p.clone(),
            Corpus::Fixture => {
                let root = dir.join("repo");
                aptix::index::write_sample_repo(&root)?;
                root
            }
        };
        if let Some(vectors) = &child_vectors {
            child::index(&settings, vectors, &root).await.context("indexing the corpus")?;
        }
        let mut index = IndexOptions::new(&root, "aptix");
        index.progress = false;
        // Every agent context's collection (tenants have their own), the same corpus in each.
        let collections: std::collections::BTreeSet<String> =
            settings.agent_contexts.values().map(|a| a.collection.clone()).collect();
        for collection in collections.into_iter().filter(|_| child_vectors.is_none()) {
            index_repository(&deps.retrieval, &collection, &index)
                .await
                .context("indexing the corpus")?;
        }
        let conn = connect(settings.amqp.url.expose()).await.context("connecting to RabbitMQ")?;
        let publisher = Publisher::connect(settings.amqp.url.expose()).await?;
        let topology = pipeline::topology(&settings);
        declare_or_undo(&conn, &publisher, &topology, &settings.tenant_names()).await?;
        Ok(BenchEnv {
            id: id.to_owned(),
            settings,
            deps,
            llm,
            topology,
            conn,
            publisher,
            sim: Some(sim),
            dir: dir.to_owned(),
            admin_url: admin_url.to_owned(),
            db_name: db_name.to_owned(),
            running: Vec::new(),
            child_vectors,
            child: None,
            extra_topologies: Vec::new(),
            session_queues: Mutex::new(Vec::new()),
        })
    }

    /// Where the simulator's and the pipeline process's CPU time are read.
    pub fn cpu_sources(&self) -> CpuSources {
        CpuSources {
            sim: self.sim.as_ref().and_then(Simulator::cpu),
            pipeline: self.child.as_ref().map(PipelineProcess::pid),
        }
    }

    /// The pipeline process's pid, once started.
    pub fn pipeline_pid(&self) -> Option<u32> {
        self.child.as_ref().map(PipelineProcess::pid)
    }

    /// Most LLM calls in flight since the last [`BenchEnv::reset_peak`].
    pub fn peak_in_flight(&self) -> usize {
        self.child.as_ref().map_or_else(|| self.llm.peak_in_flight(), |c| c.peak_in_flight())
    }

    /// Starts a new peak measurement of the calls in flight.
    pub fn reset_peak(&self) {
        self.llm.reset_peak();
        if let Some(c) = &self.child {
            c.reset_peak();
        }
    }

    /// Starts `copies` consumers of every stage: in this process, or as `aptix run` in its own
    /// when the environment was built with `pipeline_process`.
    pub async fn start_all(&mut self, copies: usize) -> anyhow::Result<()> {
        let Some(vectors) = &self.child_vectors else {
            self.start(&aptix::stages::names(), copies);
            return Ok(());
        };
        let names = aptix::stages::names();
        let queues = names.iter().map(|s| self.topology.stage_queue(*s)).collect();
        let started =
            PipelineProcess::start(&self.settings, vectors, copies, queues, &self.conn).await?;
        self.child = Some(started);
        Ok(())
    }

    /// The simulator's pid, when it runs as a process of its own.
    pub fn sim_pid(&self) -> Option<u32> {
        self.sim.as_ref().and_then(Simulator::pid)
    }

    /// Starts `copies` consumers of each of `stages` (one `pipeline::run` call).
    pub fn start(&mut self, stages: &[StageName], copies: usize) {
        let token = CancellationToken::new();
        let (deps, t, stages) = (self.deps.clone(), token.clone(), stages.to_vec());
        let task = tokio::spawn(async move { pipeline::run(deps, &stages, copies, t).await });
        self.running.push((token, task));
    }

    /// Stops every started stage consumer and waits for it.
    pub async fn stop(&mut self) {
        for (token, _) in &self.running {
            token.cancel();
        }
        for (_, task) in self.running.drain(..) {
            let _ = task.await;
        }
        if let Some(child) = self.child.take() {
            child.stop().await;
        }
    }

    /// A topology under `bench-<id>-<suffix>` (for the relay), deleted at teardown.
    pub fn extra_topology(&mut self, suffix: &str) -> Topology {
        // The pipeline's queue type, so the relay pays what a cluster's replication costs too.
        let t = Topology::new(&format!("bench-{}-{suffix}", self.id))
            .with_stages(&aptix::stages::names())
            .with_layout(1, self.settings.amqp.queue_type);
        self.extra_topologies.push(t.clone());
        t
    }

    /// Remembers session queues (a tenant's, with `tenant`) to delete at teardown.
    pub fn track_sessions(
        &self,
        topology: &Topology,
        tenant: Option<&TenantName>,
        sessions: &[SessionId],
    ) {
        if let Ok(mut q) = self.session_queues.lock() {
            q.extend(sessions.iter().map(|s| topology.session_queue_of(tenant, s)));
        }
    }

    /// Stops the stages, deletes the queues, exchanges and database, stops the simulator and
    /// removes the temporary directory. Best effort: a failure is reported, the rest still runs.
    pub async fn teardown(mut self) {
        self.stop().await;
        if let Ok(ch) = self.conn.create_channel().await {
            let sessions: Vec<String> =
                self.session_queues.lock().map(|q| q.clone()).unwrap_or_default();
            for q in sessions {
                delete_queue(&ch, &q).await;
            }
            let mut topologies = vec![self.topology.clone()];
            topologies.append(&mut self.extra_topologies);
            let tenants = self.settings.tenant_names();
            for t in &topologies {
                delete_topology(&ch, t, &tenants).await;
            }
            let _ = ch.close(200, "bench done".into()).await;
        }
        let _ = self.conn.close(200, "bench done".into()).await;
        self.deps.store.close().await;
        drop_database(&self.admin_url, &self.db_name).await;
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
        // The embedded store flushes and unlocks when the last holder lets go.
        drop(self.deps);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Declares `topology`, or, when the broker refuses a part of it, deletes what was declared
/// before that part and fails: setup's error path cannot reach the queues otherwise (every name
/// under the run's fresh prefix is the run's own). A refused declaration closes the publisher's
/// channel, so the deletes run on a channel of `conn`.
async fn declare_or_undo(
    conn: &lapin::Connection,
    publisher: &Publisher,
    topology: &Topology,
    tenants: &[TenantName],
) -> anyhow::Result<()> {
    let Err(error) = topology.declare(publisher.channel()).await else { return Ok(()) };
    match conn.create_channel().await {
        Ok(ch) => {
            delete_topology(&ch, topology, tenants).await;
            let _ = ch.close(200, "bench setup failed".into()).await;
        }
        Err(error) => tracing::warn!(%error, "benchmark setup could not undo its declarations"),
    }
    Err(anyhow::Error::new(error).context("declaring the pipeline's topology"))
}

/// Deletes `t`'s queues and exchanges, with the dead-letter and unrouted queues of `tenants`
/// (declared when a tenant's first message lands there).
async fn delete_topology(ch: &lapin::Channel, t: &Topology, tenants: &[TenantName]) {
    let mut queues: Vec<String> = t.stages().iter().flat_map(|s| t.consumed_queues(*s)).collect();
    queues.extend(t.ingress_queues());
    queues.push(t.dead());
    queues.push(t.unrouted());
    for tenant in tenants {
        queues.push(t.dead_of(Some(tenant)));
        queues.push(t.unrouted_of(Some(tenant)));
    }
    queues.extend(RETRY_TIERS_MS.iter().map(|ms| t.delay_exchange(*ms)));
    for q in queues {
        delete_queue(ch, &q).await;
    }
    let mut exchanges = vec![t.replies_exchange(), t.requests_exchange()];
    if t.partitions() > 1 {
        exchanges.push(t.partition_exchange(t.partitions()));
    }
    for stage in t.stages() {
        exchanges.extend(t.stage_layouts(*stage).into_iter().map(|l| l.exchange));
    }
    exchanges.extend(RETRY_TIERS_MS.iter().map(|ms| t.delay_exchange(*ms)));
    for e in exchanges {
        let deleted = ch.exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default());
        report("exchange", &e, deleted.await);
    }
}

async fn delete_queue(ch: &lapin::Channel, name: &str) {
    report("queue", name, ch.queue_delete(name.into(), QueueDeleteOptions::default()).await);
}

/// Reports a delete the broker refused: what it names stays on the broker.
fn report<T>(kind: &str, name: &str, result: Result<T, lapin::Error>) {
    if let Err(error) = result {
        tracing::warn!(kind, name, %error, "benchmark teardown left it behind");
    }
}

async fn drop_database(admin_url: &str, name: &str) {
    match sqlx::PgPool::connect(admin_url).await {
        Ok(pool) => {
            let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
            if let Err(error) = sqlx::query(&sql).execute(&pool).await {
                tracing::warn!(%error, database = name, "could not drop the benchmark database");
            }
            pool.close().await;
        }
        Err(error) => {
            tracing::warn!(%error, database = name, "could not connect to drop the benchmark database")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/aptix", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u@h/aptix?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
    }

    const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

    async fn queue_exists(conn: &lapin::Connection, name: &str) -> bool {
        use lapin::options::QueueDeclareOptions;
        // A passive declare of a missing queue closes its channel: one channel per look.
        let ch = conn.create_channel().await.unwrap();
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        ch.queue_declare(name.into(), passive, lapin::types::FieldTable::default()).await.is_ok()
    }

    /// The run's unrouted queue, declared late, already exists as a transient queue, so the
    /// broker refuses the durable one after the ingress queue was declared: undone, nothing of
    /// the run's is left.
    #[tokio::test]
    async fn a_declaration_refused_partway_leaves_nothing_declared_before_it() {
        use lapin::options::QueueDeclareOptions;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("bench-test-{}", &id[..12]);
        let topology = Topology::new(&prefix).with_stages(&aptix::stages::names());
        let ingress = topology.ingress_queues()[0].clone();
        let conn = connect(AMQP).await.unwrap();
        let transient = || async {
            let ch = conn.create_channel().await.unwrap();
            let (name, opts) = (topology.unrouted(), QueueDeclareOptions::default());
            let table = lapin::types::FieldTable::default();
            ch.queue_declare(name.as_str().into(), opts, table).await.unwrap();
        };
        transient().await;

        // Without the undo, the refusal leaves what came before it.
        let publisher = Publisher::connect(AMQP).await.unwrap();
        let refused = topology.declare(publisher.channel()).await.unwrap_err();
        assert!(refused.to_string().contains("inequivalent arg 'durable'"), "{refused}");
        assert!(queue_exists(&conn, &ingress).await, "the ingress queue is declared first");

        let publisher = Publisher::connect(AMQP).await.unwrap();
        let error = declare_or_undo(&conn, &publisher, &topology, &[]).await.unwrap_err();
        assert!(format!("{error:#}").contains("inequivalent arg 'durable'"), "{error:#}");
        let last = *topology.stages().last().unwrap();
        for queue in [ingress, topology.stage_queue(last), topology.unrouted()] {
            assert!(!queue_exists(&conn, &queue).await, "{queue} was left behind");
        }
        let ch = conn.create_channel().await.unwrap();
        let passive =
            lapin::options::ExchangeDeclareOptions { passive: true, ..Default::default() };
        let entry = topology.requests_exchange();
        let kind = lapin::ExchangeKind::Topic;
        let looked = ch.exchange_declare(entry.as_str().into(), kind, passive, Default::default());
        assert!(looked.await.is_err(), "the entry exchange was left behind");
    }
}
