//! The pipeline as a process of its own (`--pipeline-process`): `aptix run`, the binary built
//! beside this one, configured by environment for the benchmark's prefix, database, simulator and
//! vector store, so its peak memory and CPU are read apart from the load driver's. The corpus is
//! indexed by `aptix index` first: the embedded store admits one process at a time.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use aptix::config::Settings;

use super::sim_process::{aptix_exe, free_port};

/// How often the child's metrics are read for the calls it has in flight.
const SAMPLE: Duration = Duration::from_millis(100);

/// `aptix` beside this binary, with the benchmark's settings in its environment.
pub fn aptix(settings: &Settings, data_dir: &Path, metrics_port: u16) -> anyhow::Result<Command> {
    let mut cmd = Command::new(aptix_exe()?);
    cmd.env("APTIX__AMQP__PREFIX", &settings.amqp.prefix)
        .env("APTIX__AMQP__URL", settings.amqp.url.expose())
        .env("APTIX__DATABASE__URL", settings.database.url.expose())
        .env("APTIX__LLM__BASE_URL", settings.llm.base_url.expose())
        .env("APTIX__LLM__REQUEST_TIMEOUT_MS", settings.llm.request_timeout_ms.to_string())
        .env("APTIX__VECTOR__DATA_DIR", data_dir)
        .env("APTIX__TELEMETRY__METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
        .env_remove("APTIX__LLM__API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true);
    Ok(cmd)
}

/// Indexes `root` as repository `aptix` into the child's vector store, with `aptix index`.
pub async fn index(settings: &Settings, data_dir: &Path, root: &Path) -> anyhow::Result<()> {
    let mut cmd = aptix(settings, data_dir, 0)?;
    cmd.args(["index", "--repo", "aptix", "--quiet"]).arg(root);
    let status = cmd.status().await.context("running aptix index")?;
    anyhow::ensure!(status.success(), "aptix index ended with {status}");
    Ok(())
}

/// A running `aptix run`, and the most LLM calls it had in flight (its `invoke` stage's
/// `aptix_stage_in_flight`, read every [`SAMPLE`]).
pub struct PipelineProcess {
    child: Child,
    pid: u32,
    peak: Arc<AtomicUsize>,
    sampling: CancellationToken,
}

impl PipelineProcess {
    /// Starts `aptix run --copies N` and waits until every stage queue has a consumer.
    pub async fn start(
        settings: &Settings,
        data_dir: &Path,
        copies: usize,
        stage_queues: Vec<String>,
        conn: &lapin::Connection,
    ) -> anyhow::Result<PipelineProcess> {
        let port = free_port()?;
        let mut cmd = aptix(settings, data_dir, port)?;
        let child = cmd.args(["run", "--copies", &copies.to_string()]).spawn()?;
        let pid = child.id().context("the pipeline process ended at once")?;
        until_consumed(conn, &stage_queues).await?;
        let (peak, sampling) = (Arc::new(AtomicUsize::new(0)), CancellationToken::new());
        tokio::spawn(sample_in_flight(port, peak.clone(), sampling.clone()));
        Ok(PipelineProcess { child, pid, peak, sampling })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Most invoke messages in flight seen since the last [`PipelineProcess::reset_peak`].
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak measurement.
    pub fn reset_peak(&self) {
        self.peak.store(0, Ordering::Relaxed);
    }

    /// SIGTERM, then waits for it to finish what it holds (killed after 30 s).
    pub async fn stop(mut self) {
        self.sampling.cancel();
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            tracing::warn!(pid = self.pid, "the pipeline process did not stop; killing it");
            let _ = self.child.kill().await;
        }
    }
}

async fn until_consumed(conn: &lapin::Connection, queues: &[String]) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    for _ in 0..300 {
        let mut all = true;
        for q in queues {
            let args = lapin::types::FieldTable::default();
            let d = ch.queue_declare(q.as_str().into(), passive, args).await?;
            all &= d.consumer_count() > 0;
        }
        if all {
            let _ = ch.close(200, "up".into()).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the pipeline process did not consume every stage queue within 30 s")
}

async fn sample_in_flight(port: u16, peak: Arc<AtomicUsize>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        if let Some(n) = invoke_in_flight(port).await {
            peak.fetch_max(n, Ordering::Relaxed);
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(SAMPLE) => {}
        }
    }
}

/// `aptix_stage_in_flight{stage="invoke"}` from the child's `/metrics`.
async fn invoke_in_flight(port: u16) -> Option<usize> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let line = text.lines().find(|l| l.starts_with("aptix_stage_in_flight{stage=\"invoke\"}"))?;
    line.split_whitespace().last()?.parse::<f64>().ok().map(|v| v as usize)
}
