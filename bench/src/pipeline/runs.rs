//! The four benchmarks, each as "one run in a fresh environment" repeated `--runs` times, and
//! what they share: the repeat loop, CPU and WAL accounting, queue-depth sampling, the closed
//! loop and hop-size calibration.

mod ceiling;
mod growth;
mod inflight;
mod overhead;
mod scaling;
mod stage_times;

pub use ceiling::ceiling;
pub use growth::growth;
pub use inflight::inflight;
pub use overhead::overhead;
pub use scaling::scaling;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::driver::{self, Driver, TurnIds, TurnSample};
use super::env::{BenchEnv, Corpus, EnvOptions};
use super::profile::{self, Profile};
use super::relay::{self, HopSizes};
use super::report::{finish, RunReport, Target};
use super::sys::{self, CpuSnapshot, CpuUse, Wal};
use super::{failures, Ceiling, CommonArgs, Growth, Inflight, Overhead, Scaling};
use crate::Percentiles;
use aptix::broker::{StageName, Topology};
use aptix::config::Settings;
use aptix::sim::Latency;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn env_options(common: &CommonArgs, corpus: &Corpus, latency_ms: u64) -> EnvOptions {
    EnvOptions {
        corpus: corpus.clone(),
        latency: Latency { fixed_ms: latency_ms, ..Latency::default() },
        sim_process: common.sim_process,
        pipeline_process: false,
    }
}

/// Runs `once` in a fresh environment `runs` times, tearing each down whatever happened.
async fn repeat<F>(
    common: &CommonArgs,
    settings: &Settings,
    opts: &EnvOptions,
    mut once: F,
) -> anyhow::Result<Vec<RunReport>>
where
    F: for<'a> FnMut(
        &'a mut BenchEnv,
        usize,
    ) -> futures_util::future::BoxFuture<'a, anyhow::Result<RunReport>>,
{
    let mut out = Vec::new();
    for i in 0..common.runs.max(1) {
        let idle = idle_gate(common).await;
        let mut env = BenchEnv::setup(settings, opts).await?;
        let result = once(&mut env, i).await;
        env.teardown().await;
        let mut report = result?;
        if let Some(idle) = idle {
            report.detail("machine_idle_before_pct", idle);
        }
        out.push(report);
    }
    Ok(out)
}

/// Waits for an idle machine when asked to; returns the idle share seen.
async fn idle_gate(common: &CommonArgs) -> Option<f64> {
    (common.wait_idle > 0.0).then_some(())?;
    Some(sys::wait_idle(common.wait_idle, Duration::from_secs(1800)).await)
}

/// Failed or unanswered turns.
fn failed(samples: &[TurnSample]) -> usize {
    samples.iter().filter(|s| !s.ok).count()
}

/// CPU milliseconds per completed turn, by process.
/// Keys are `<key>cpu_<process>_ms`, labels `<label><process> CPU per turn`.
fn cpu_per_turn(r: &mut RunReport, key: &str, label: &str, cpu: &CpuUse, turns: usize) {
    let per = |s: f64| s * 1e3 / turns.max(1) as f64;
    r.add(
        format!("{key}cpu_aptix_ms"),
        format!("{label}aptix CPU per turn (w/o simulator)"),
        "ms",
        per(cpu.aptix_s),
    );
    r.add(
        format!("{key}cpu_sim_ms"),
        format!("{label}simulator CPU per turn"),
        "ms",
        per(cpu.sim_s),
    );
    r.add(
        format!("{key}cpu_rabbitmq_ms"),
        format!("{label}RabbitMQ CPU per turn"),
        "ms",
        per(cpu.rabbitmq_s),
    );
    r.add(
        format!("{key}cpu_postgres_ms"),
        format!("{label}PostgreSQL CPU per turn"),
        "ms",
        per(cpu.postgres_s),
    );
    r.add(
        format!("{key}cpu_all_in_ms"),
        format!("{label}CPU per turn, all in (aptix + RabbitMQ + PostgreSQL)"),
        "ms",
        per(cpu.aptix_s + cpu.rabbitmq_s + cpu.postgres_s),
    );
}

/// WAL written per completed turn (cluster-wide counters: other databases' writes count too).
fn wal_per_turn(r: &mut RunReport, key: &str, label: &str, wal: &Wal, turns: usize) {
    let n = turns.max(1) as f64;
    r.add(
        format!("{key}wal_kb"),
        format!("{label}PostgreSQL WAL per turn"),
        "KB",
        wal.bytes / 1e3 / n,
    );
    r.add(
        format!("{key}wal_syncs"),
        format!("{label}PostgreSQL WAL flushes per turn"),
        "flushes",
        wal.syncs as f64 / n,
    );
}

/// AMQP methods and PostgreSQL transactions per completed turn.
fn profile_per_turn(r: &mut RunReport, key: &str, label: &str, p: &Profile) {
    for (method, n) in &p.amqp {
        let k = method.replace('.', "_");
        r.add(format!("{key}amqp_{k}"), format!("{label}AMQP {method} per turn"), "methods", *n);
    }
    r.add(
        format!("{key}pg_commits"),
        format!("{label}PostgreSQL transactions per turn"),
        "xacts",
        p.commits,
    );
}

/// Average stored sizes of what a turn leaves in PostgreSQL (compressed, as stored).
async fn stored_sizes(pool: &sqlx::PgPool) -> Value {
    let q = |sql: &'static str| async move {
        sqlx::query_scalar::<_, Option<f64>>(sql).fetch_one(pool).await.ok().flatten()
    };
    json!({
        "response_record_row_bytes": q("SELECT avg(pg_column_size(r.*))::float8 FROM response_records r").await,
        "llm_result_bytes": q("SELECT avg(pg_column_size(result))::float8 FROM llm_results").await,
        "session_state_bytes": q("SELECT avg(pg_column_size(state))::float8 FROM sessions").await,
        "turn_row_bytes": q("SELECT avg(pg_column_size(t.*))::float8 FROM turns t").await,
        "outbox_rows_left": q("SELECT count(*)::float8 FROM outbox").await,
    })
}

/// Mean ready messages in each stage queue, sampled every 100 ms until `stop` fires.
fn sample_depths(
    ch: lapin::Channel,
    topology: &Topology,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<(String, f64)>> {
    let topology = topology.clone();
    tokio::spawn(async move {
        let stages = topology.stages().to_vec();
        let mut sums = vec![0u64; stages.len()];
        let mut n = 0u64;
        while !stop.is_cancelled() {
            for (i, s) in stages.iter().enumerate() {
                // A stage's depth is all of its queues' (ingress or stage partitions).
                let queues = topology.consumed_queues(*s);
                for q in queues {
                    let opts = QueueDeclareOptions { passive: true, ..Default::default() };
                    if let Ok(d) =
                        ch.queue_declare(q.as_str().into(), opts, FieldTable::default()).await
                    {
                        sums[i] += u64::from(d.message_count());
                    }
                }
            }
            n += 1;
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        let _ = ch.close(200, "done".into()).await;
        stages
            .iter()
            .zip(sums)
            .map(|(s, sum)| (s.as_str().to_owned(), sum as f64 / n.max(1) as f64))
            .collect()
    })
}

/// The stage whose input queue was deepest on average.
fn slowest(depths: &[(String, f64)]) -> StageName {
    let best =
        depths.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|d| d.0.clone()).unwrap_or_default();
    let stages = aptix::stages::names();
    stages.iter().copied().find(|s| s.as_str() == best).unwrap_or(stages[0])
}

/// A closed-loop load.
struct Load {
    sessions: usize,
    /// Bytes of the active file in each request (0: none).
    file_bytes: usize,
    secs: f64,
    warmup: f64,
    ramp: Duration,
    timeout: Duration,
}

/// One closed-loop measurement of the full pipeline on `env` (stages must be running).
struct Measured {
    rate: f64,
    samples: Vec<TurnSample>,
    cpu: CpuUse,
    wal: Wal,
    depths: Vec<(String, f64)>,
    /// AMQP methods, transactions and statements per turn.
    profile: Profile,
}

async fn measure_closed(
    env: &BenchEnv,
    topology: &Topology,
    ids: &Arc<TurnIds>,
    load: &Load,
) -> anyhow::Result<Measured> {
    let (sessions_n, duration, warmup, timeout) =
        (load.sessions, load.secs, load.warmup, load.timeout);
    let sessions = driver::sessions(sessions_n);
    env.track_sessions(topology, None, &sessions);
    let driver =
        Driver::new(&env.conn, env.settings.amqp.url.expose(), topology, &sessions).await?;
    let driver = Arc::new(driver.with_file(load.file_bytes));
    let stop = CancellationToken::new();
    let depths = sample_depths(env.conn.create_channel().await?, topology, stop.clone());
    let pool = env.deps.store.pool();
    profile::enable_statements(pool).await;
    let profile_before = Profile::take(pool).await;
    let (before, wal_before) = (CpuSnapshot::take(&env.cpu_sources()), Wal::take(pool).await);
    let (start, samples) =
        driver::closed_loop(&driver, &sessions, ids, secs(duration), load.ramp, timeout).await;
    let cpu = CpuSnapshot::take(&env.cpu_sources()).since(&before);
    let wal = Wal::take(pool).await.since(&wal_before);
    let profile = Profile::take(pool).await.per_turn(&profile_before, samples.len());
    stop.cancel();
    let depths = depths.await.unwrap_or_default();
    if let Ok(d) = Arc::try_unwrap(driver) {
        d.close().await;
    }
    let (from, to) = (start + secs(warmup.min(duration * 0.5)), start + secs(duration));
    let rate = driver::throughput(&samples, from, to);
    Ok(Measured { rate, samples, cpu, wal, depths, profile })
}

/// A relay (`relay.rs`) running beside the pipeline's environment on a topology of its own,
/// moving messages of the sizes a real turn had at each hop.
struct RelayRun {
    topology: Topology,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Sizes per hop of each calibration turn.
    calibration: Vec<HopSizes>,
    /// The sizes the relay moves: the calibration turns' mean per hop.
    sizes: HopSizes,
}

impl RelayRun {
    /// Calibrates hop sizes on the real pipeline (which is stopped again), then starts the
    /// relay with each stage's prefetch.
    async fn start(env: &mut BenchEnv, ids: &Arc<TurnIds>) -> anyhow::Result<RelayRun> {
        let calibration = calibrate(env, ids).await?;
        let stages = env.topology.stages().to_vec();
        let mut sizes: HopSizes = vec![0; stages.len() + 1];
        for (k, s) in sizes.iter_mut().enumerate() {
            *s = calibration.iter().map(|c| c[k]).sum::<usize>() / calibration.len().max(1);
        }
        let topology = env.extra_topology("relay");
        topology.declare(env.publisher.channel()).await?;
        let stop = CancellationToken::new();
        let prefetch = &env.settings.pipeline.prefetch;
        let pf: Vec<u16> = stages.iter().map(|s| prefetch.get(s.as_str())).collect();
        let url = env.settings.amqp.url.expose();
        let tasks = relay::start(url, &topology, sizes.clone(), pf, stop.clone()).await?;
        Ok(RelayRun { topology, stop, tasks, calibration, sizes })
    }

    /// Stops the relay's stages and waits for them.
    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Message sizes of one turn at every hop, from the real pipeline: the stages are started one
/// at a time, and before the next one starts its input message is taken from its queue,
/// measured and put back unchanged.
async fn calibrate(env: &mut BenchEnv, ids: &Arc<TurnIds>) -> anyhow::Result<Vec<HopSizes>> {
    let session = driver::sessions(1);
    env.track_sessions(&env.topology.clone(), None, &session);
    let driver =
        Driver::new(&env.conn, env.settings.amqp.url.expose(), &env.topology, &session).await?;
    let ch = env.conn.create_channel().await?;
    let mut out = Vec::new();
    for _ in 0..2 {
        let stages = env.topology.stages().to_vec();
        let mut sizes: HopSizes = vec![0; stages.len() + 1];
        let id = ids.next();
        let body = super::requests::request(&session[0], &id);
        sizes[0] = body.len();
        let rx = driver.submit(&session[0], &id, body).await?;
        for (i, stage) in stages.iter().enumerate() {
            env.start(&[*stage], 1);
            let Some(next) = stages.get(i + 1) else { break };
            let queues = env.topology.consumed_queues(*next);
            let deadline = Instant::now() + Duration::from_secs(30);
            let (queue, msg) = 'found: loop {
                // With stage partitions the message is in the session's partition.
                for queue in &queues {
                    let get = ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true });
                    if let Some(m) = get.await? {
                        break 'found (queue.clone(), m);
                    }
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "calibration: nothing arrived in {}",
                    queues.join(", ")
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            sizes[i + 1] = msg.delivery.data.len();
            let props = &msg.delivery.properties;
            let id = props.message_id().as_ref().map_or_else(String::new, |m| m.to_string());
            let mut again = aptix::broker::OutMessage::to_queue(
                queue.clone(),
                "turn",
                id,
                msg.delivery.data.clone(),
            );
            for key in ["x-aptix-session-id", "x-aptix-turn-id", "traceparent", "x-aptix-mac"] {
                if let Some(value) = aptix::broker::header_text(props.headers().as_ref(), key) {
                    again = again.header(key, value);
                }
            }
            env.publisher
                .publish(&again)
                .await
                .with_context(|| format!("calibration: republish to {queue} was not confirmed"))?;
        }
        let reply = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .context("calibration: no final reply")?
            .context("calibration: reply channel closed")?;
        anyhow::ensure!(reply.ok, "calibration turn failed");
        sizes[stages.len()] = reply.bytes;
        env.stop().await;
        out.push(sizes);
    }
    driver.close().await;
    let _ = ch.close(200, "done".into()).await;
    Ok(out)
}
