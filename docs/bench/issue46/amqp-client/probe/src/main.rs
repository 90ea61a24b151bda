//! Issue 46 probe: the ceiling's relay (five durable queues, a closed loop of sessions) on one
//! of two AMQP clients, on tokio's current-thread runtime as a pipeline process of one worker
//! runs. lapin 4 runs each connection's socket I/O on a thread of its own (`lapin-io-loop`);
//! amqprs 2 runs it as tokio tasks. What differs between the two runs is the client, so the
//! difference in this process's CPU per turn bounds what moving the pipeline's socket I/O onto
//! its runtime could save.
//!
//! Each stage has a consuming and a publishing connection (as the pipeline's stages do),
//! consumes with the pipeline's prefetch and manual acks, publishes the next message
//! (persistent, mandatory, the stage's hop size, the delivery's headers copied) on a confirm
//! channel, waits for the confirm, then acks. Prints one JSON line.
//!
//! `amqp-client-probe lapin|amqprs [sessions] [seconds] [warmup]`, or `amqp-client-probe
//! semantics` for what amqprs does in the cases the broker runtime depends on.

mod semantics;
mod with_amqprs;
mod with_lapin;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The ceiling's hop sizes at d35bd9e (`relay_used`): the request, four middle messages, the reply.
pub const SIZES: [usize; 6] = [174, 406, 14018, 29943, 34018, 946];
/// The pipeline's prefetch per stage (validate, retrieve, assemble, invoke, persist).
pub const PREFETCH: [u16; 5] = [64, 32, 64, 1024, 64];
pub const SESSION_HEADER: &str = "x-probe-session";
pub const TURN_HEADER: &str = "x-probe-turn";
/// Messages the broker returned (unroutable): none while the queues exist.
pub static RETURNED: AtomicU64 = AtomicU64::new(0);

/// Queue names of one run: five stage queues and the reply queue.
#[derive(Clone)]
pub struct Names {
    pub stages: Vec<String>,
    pub reply: String,
}

impl Names {
    fn new() -> Self {
        let prefix = format!("probe-{:08x}", rand::random::<u32>());
        Names {
            stages: (0..5).map(|i| format!("{prefix}.stage{i}")).collect(),
            reply: format!("{prefix}.reply"),
        }
    }
    /// Where stage `i` publishes.
    pub fn next(&self, i: usize) -> String {
        self.stages.get(i + 1).cloned().unwrap_or_else(|| self.reply.clone())
    }
    pub fn all(&self) -> Vec<String> {
        let mut all = self.stages.clone();
        all.push(self.reply.clone());
        all
    }
}

/// CPU seconds, voluntary and involuntary context switches of this process.
fn own_usage() -> (f64, i64, i64) {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(u.ru_utime) + secs(u.ru_stime), u.ru_nvcsw, u.ru_nivcsw)
}

/// CPU seconds of every `beam.smp` on the machine (the broker).
fn broker_cpu() -> f64 {
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else { continue };
        if comm.trim() != "beam.smp" {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else { continue };
        let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += (ticks(11) + ticks(12)) / tick;
    }
    total
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let client = args.get(1).cloned().unwrap_or_else(|| "lapin".into());
    if client == "amqprs-get" {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(semantics::get_one(args.get(2).map(String::as_str).unwrap_or("")))?;
        std::process::exit(0)
    }
    if client == "lapin-get" {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(with_lapin::get_one(args.get(2).map(String::as_str).unwrap_or("")))?;
        std::process::exit(0)
    }
    let sessions: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let seconds: u64 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let warmup: u64 = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(3);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    if client == "semantics" {
        rt.block_on(semantics::run())?;
        std::process::exit(0)
    }
    rt.block_on(async move {
        let names = Names::new();
        let done = Arc::new(AtomicU64::new(0));
        let url = "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=5";
        let cleanup = with_lapin::declare(url, &names).await?;
        match client.as_str() {
            "lapin" => with_lapin::start(url, &names, sessions, done.clone()).await?,
            "amqprs" => with_amqprs::start(&names, sessions, done.clone()).await?,
            other => anyhow::bail!("unknown client {other}"),
        }
        tokio::time::sleep(Duration::from_secs(warmup)).await;
        let (t0, n0, (c0, v0, i0), b0) =
            (Instant::now(), done.load(Ordering::Relaxed), own_usage(), broker_cpu());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (wall, n1, (c1, v1, i1), b1) =
            (t0.elapsed().as_secs_f64(), done.load(Ordering::Relaxed), own_usage(), broker_cpu());
        let turns = (n1 - n0) as f64;
        println!(
            "{}",
            serde_json::json!({
                "client": client, "sessions": sessions, "seconds": wall, "turns": turns,
                "turns_per_s": turns / wall,
                "client_cpu_ms_per_turn": (c1 - c0) * 1e3 / turns,
                "broker_cpu_ms_per_turn": (b1 - b0) * 1e3 / turns,
                "voluntary_switches_per_turn": (v1 - v0) as f64 / turns,
                "involuntary_switches_per_turn": (i1 - i0) as f64 / turns,
                "returned": RETURNED.load(Ordering::Relaxed),
                "threads": std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0),
            })
        );
        cleanup.delete(&names).await?;
        anyhow::Ok(())
    })?;
    // The clients' tasks and threads are still running; the figures are printed.
    std::process::exit(0)
}
