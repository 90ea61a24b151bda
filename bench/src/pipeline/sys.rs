//! What the machine did during a measurement, from `/proc` (Linux; elsewhere the figures are
//! absent): CPU time of this process, of RabbitMQ (`beam.smp`) and of PostgreSQL, the whole
//! machine's busy share, and this process's peak resident memory.

use std::time::Instant;

use super::sim_process::SimCpu;

/// Clock ticks per second of `/proc` CPU times (USER_HZ, 100 on every Linux ABI).
const TICKS: f64 = 100.0;

/// Where CPU time is read besides this process and the servers.
#[derive(Debug, Clone, Default)]
pub struct CpuSources {
    /// The simulator.
    pub sim: Option<SimCpu>,
    /// The pipeline, when it is a process of its own: counted with this process's.
    pub pipeline: Option<u32>,
}

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSnapshot {
    at: Instant,
    own: u64,
    sim: u64,
    /// The simulator is another process: `own` does not include it.
    sim_apart: bool,
    rabbit: u64,
    postgres: u64,
    machine_busy: u64,
    machine_total: u64,
}

/// CPU use between two snapshots.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuUse {
    /// Seconds of wall time.
    pub wall_s: f64,
    /// CPU seconds of this process without the simulator's thread, and of the pipeline process
    /// when there is one: the pipeline and the load driver.
    pub aptix_s: f64,
    /// CPU seconds of the simulator's thread.
    pub sim_s: f64,
    /// CPU seconds of RabbitMQ.
    pub rabbitmq_s: f64,
    /// CPU seconds of PostgreSQL (all backends).
    pub postgres_s: f64,
    /// Share of all cores busy, 0-1.
    pub machine_busy: f64,
    /// CPU seconds of everything else on the machine (other processes, the kernel's own work):
    /// busy time not accounted to the processes above. High values mean a disturbed run.
    pub others_s: f64,
}

fn stat_ticks(path: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn machine() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else { return (0, 0) };
    let Some(line) = text.lines().next() else { return (0, 0) };
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

impl CpuSnapshot {
    /// Reads the counters now, the simulator's and the pipeline process's from `sources`.
    pub fn take(sources: &CpuSources) -> CpuSnapshot {
        let sim = sources.sim.as_ref();
        let pipeline = sources.pipeline.and_then(|pid| stat_ticks(&format!("/proc/{pid}/stat")));
        let (mut rabbit, mut postgres) = (0, 0);
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                let bucket = match comm.trim() {
                    "beam.smp" => &mut rabbit,
                    c if c.starts_with("postgres") => &mut postgres,
                    _ => continue,
                };
                *bucket += stat_ticks(&format!("/proc/{pid}/stat")).unwrap_or(0);
            }
        }
        let (machine_busy, machine_total) = machine();
        CpuSnapshot {
            at: Instant::now(),
            own: stat_ticks("/proc/self/stat").unwrap_or(0) + pipeline.unwrap_or(0),
            sim: sim.and_then(|s| stat_ticks(&s.stat)).unwrap_or(0),
            sim_apart: sim.is_some_and(|s| s.apart),
            rabbit,
            postgres,
            machine_busy,
            machine_total,
        }
    }

    /// Use since `earlier`. (Processes that exited in between drop out of the sums.)
    pub fn since(&self, earlier: &CpuSnapshot) -> CpuUse {
        let secs = |a: u64, b: u64| a.saturating_sub(b) as f64 / TICKS;
        let total = self.machine_total.saturating_sub(earlier.machine_total);
        let busy = secs(self.machine_busy, earlier.machine_busy);
        let sim_in_own = if self.sim_apart { 0.0 } else { secs(self.sim, earlier.sim) };
        let ours = secs(self.own, earlier.own) + secs(self.sim, earlier.sim) - sim_in_own
            + secs(self.rabbit, earlier.rabbit)
            + secs(self.postgres, earlier.postgres);
        CpuUse {
            others_s: (busy - ours).max(0.0),
            wall_s: self.at.duration_since(earlier.at).as_secs_f64(),
            aptix_s: secs(self.own, earlier.own) - sim_in_own,
            sim_s: secs(self.sim, earlier.sim),
            rabbitmq_s: secs(self.rabbit, earlier.rabbit),
            postgres_s: secs(self.postgres, earlier.postgres),
            machine_busy: if total == 0 {
                0.0
            } else {
                self.machine_busy.saturating_sub(earlier.machine_busy) as f64 / total as f64
            },
        }
    }
}

/// A `/proc/self/status` field in MiB (`VmHWM`, `VmRSS`).
pub fn status_mib(field: &str) -> Option<f64> {
    status_mib_of("self", field)
}

/// The same of process `pid` ("self" for this one).
pub fn status_mib_of(pid: &str, field: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Resets this process's peak RSS (`VmHWM`) to its current RSS (Linux 4.0+); returns whether
/// it worked.
pub fn reset_peak_rss() -> bool {
    reset_peak_rss_of("self")
}

/// The same for process `pid`.
pub fn reset_peak_rss_of(pid: &str) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The machine, for reports: cores, memory, CPU model, kernel.
pub fn machine_info() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_default();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let kernel =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": model,
        "memory_gib": (mem_gib * 10.0).round() / 10.0,
        "kernel": kernel,
        "profile": if cfg!(debug_assertions) { "dev (debug assertions, crate unoptimised)" } else { "release" },
    })
}

/// Cluster-wide WAL counters (`pg_stat_wal`, PostgreSQL 14+).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Wal {
    /// WAL records.
    pub records: i64,
    /// WAL bytes.
    pub bytes: f64,
    /// WAL flushes to disk (`wal_sync`).
    pub syncs: i64,
}

impl Wal {
    /// Reads the counters; zeros when the view is unavailable.
    pub async fn take(pool: &sqlx::PgPool) -> Wal {
        let row: Result<(i64, f64, i64), _> =
            sqlx::query_as("SELECT wal_records, wal_bytes::float8, wal_sync FROM pg_stat_wal")
                .fetch_one(pool)
                .await;
        row.map(|(records, bytes, syncs)| Wal { records, bytes, syncs }).unwrap_or_default()
    }

    /// Counters since `earlier`.
    pub fn since(&self, earlier: &Wal) -> Wal {
        Wal {
            records: self.records - earlier.records,
            bytes: self.bytes - earlier.bytes,
            syncs: self.syncs - earlier.syncs,
        }
    }
}

/// Waits until the machine's cores are at least `min_idle_pct` idle over five seconds, at most
/// `max_wait`; returns the last idle share seen. Other work on a shared machine skews figures.
pub async fn wait_idle(min_idle_pct: f64, max_wait: std::time::Duration) -> f64 {
    let started = Instant::now();
    let mut announced = false;
    loop {
        let (b0, t0) = machine();
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let (b1, t1) = machine();
        let idle =
            100.0 - b1.saturating_sub(b0) as f64 * 100.0 / t1.saturating_sub(t0).max(1) as f64;
        if idle >= min_idle_pct || started.elapsed() >= max_wait {
            if announced {
                println!("  machine {idle:.0} % idle, starting");
            }
            return idle;
        }
        if !announced {
            println!("  waiting for the machine to be {min_idle_pct:.0} % idle (now {idle:.0} %)");
            announced = true;
        }
    }
}
