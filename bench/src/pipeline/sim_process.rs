//! The Responses simulator as a process of its own (`aptix sim`, the binary built beside this
//! one), so that the benchmark process's peak memory is the pipeline's and the driver's, without
//! the simulator's bodies in flight (`--sim-process`). The default keeps it on a thread
//! (`sim_thread`): no second binary needed.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use aptix::sim::SimConfig;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::sim_thread::SimThread;

/// Where the simulator's CPU time is read, and whether it is part of this process's own.
#[derive(Debug, Clone)]
pub struct SimCpu {
    /// Its `/proc/.../stat`.
    pub stat: String,
    /// Whether it runs in another process (then this process's CPU time excludes it already).
    pub apart: bool,
}

/// The simulator, on a thread or in a child process.
pub enum Simulator {
    /// A thread of this process.
    Thread(SimThread),
    /// `aptix sim` as a child process.
    Process {
        /// Where it listens.
        base_url: String,
        /// The child.
        child: tokio::process::Child,
    },
}

/// The `aptix` binary built beside this one.
pub fn aptix_exe() -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?.with_file_name("aptix");
    anyhow::ensure!(exe.is_file(), "{} is missing (build it: cargo build -p aptix)", exe.display());
    Ok(exe)
}

/// A free loopback port: bound, read and released; a child binds it a moment later.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Simulator {
    /// Starts it with `config` on a thread, or as a process when `apart`.
    pub async fn start(config: SimConfig, apart: bool) -> anyhow::Result<Simulator> {
        if !apart {
            return Ok(Simulator::Thread(SimThread::start(config).await?));
        }
        let exe = aptix_exe()?;
        // Port 0: the simulator binds a port of its own and prints its base URL, its first line
        // on stdout. A port chosen here and released could be taken by another server first.
        let mut child = tokio::process::Command::new(&exe)
            .args(["sim", "--listen", "127.0.0.1:0"])
            .args(["--latency-ms", &config.latency.fixed_ms.to_string()])
            .args(["--jitter-ms", &config.latency.jitter_ms.to_string()])
            .args(["--event-delay-ms", &config.latency.per_event_ms.to_string()])
            .args(["--log-capacity", &config.log_capacity.to_string()])
            .args(["--store-capacity", &config.store_capacity.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("the simulator's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
        let base_url = match first {
            Ok(Ok(Some(line))) if line.starts_with("http://") => line.trim().to_owned(),
            Ok(other) => anyhow::bail!("the simulator process printed no base URL: {other:?}"),
            Err(_) => anyhow::bail!("the simulator process printed no base URL within 10 s"),
        };
        // Whatever else it prints is read and dropped, whatever its encoding, so it never
        // blocks on a full pipe.
        let mut rest = lines.into_inner();
        tokio::spawn(async move { tokio::io::copy(&mut rest, &mut tokio::io::sink()).await });
        Ok(Simulator::Process { base_url, child })
    }

    /// Its base URL.
    pub fn base_url(&self) -> String {
        match self {
            Simulator::Thread(t) => t.base_url.clone(),
            Simulator::Process { base_url, .. } => base_url.clone(),
        }
    }

    /// Where its CPU time is read.
    pub fn cpu(&self) -> Option<SimCpu> {
        match self {
            Simulator::Thread(t) => t
                .tid
                .as_ref()
                .map(|tid| SimCpu { stat: format!("/proc/self/task/{tid}/stat"), apart: false }),
            Simulator::Process { child, .. } => {
                child.id().map(|pid| SimCpu { stat: format!("/proc/{pid}/stat"), apart: true })
            }
        }
    }

    /// The child's pid, when it is a process.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Simulator::Thread(_) => None,
            Simulator::Process { child, .. } => child.id(),
        }
    }

    /// Stops it.
    pub async fn stop(self) {
        match self {
            Simulator::Thread(t) => t.stop().await,
            Simulator::Process { mut child, .. } => {
                let _ = child.kill().await;
            }
        }
    }
}
