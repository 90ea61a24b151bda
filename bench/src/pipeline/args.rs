//! The command-line options of the pipeline benchmarks, and the sizes they resolve to (smoke or
//! full, or what was given).

use std::path::PathBuf;

use super::env::Corpus;

/// Options every pipeline benchmark takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Tiny sizes (CI smoke run: seconds); explicit options still win.
    #[arg(long)]
    pub smoke: bool,
    /// Full runs, each in a fresh environment; figures are reported as median and range.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Also write the figures as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Directory to index for retrieval [default: bench/src, the benchmark crate's sources; the
    /// 3-file fixture with --smoke].
    #[arg(long, value_name = "DIR", conflicts_with = "fixture_corpus")]
    pub corpus: Option<PathBuf>,
    /// Index the built-in 3-file fixture (tiny chunks, so small stage messages).
    #[arg(long)]
    pub fixture_corpus: bool,
    /// Longest wait for one turn's final reply, seconds.
    #[arg(long, default_value_t = 60)]
    pub turn_timeout_secs: u64,
    /// Before each run, wait (at most 30 minutes) until the machine is this % idle over 5 s;
    /// 0 does not wait. Other work on a shared machine skews every figure.
    #[arg(long, default_value_t = 0.0, value_name = "PCT")]
    pub wait_idle: f64,
    /// Run the Responses simulator as a process of its own (`aptix sim`, built beside this
    /// binary), so this process's peak memory and CPU are the pipeline's and the driver's only.
    #[arg(long)]
    pub sim_process: bool,
}

impl CommonArgs {
    pub(crate) fn corpus(&self) -> Corpus {
        if self.fixture_corpus {
            return Corpus::Fixture;
        }
        self.corpus.clone().map_or_else(|| Corpus::default_for(self.smoke), Corpus::Dir)
    }
}

/// Options of `aptix-bench ceiling`.
#[derive(Debug, Clone, clap::Args)]
pub struct CeilingArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Seconds of load for each side (relay, then pipeline) [default: 20; 2 with --smoke].
    #[arg(long)]
    pub secs: Option<f64>,
    /// Seconds at the start of each side not counted [default: 3; 0.5 with --smoke].
    #[arg(long)]
    pub warmup_secs: Option<f64>,
    /// Sessions, each sending its next turn when the previous one's reply arrived (closed loop)
    /// [default: 256; 8 with --smoke].
    #[arg(long)]
    pub sessions: Option<usize>,
}

/// Options of `aptix-bench overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Turns per second, open loop [default: 100; 20 with --smoke].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds of load [default: 30; 2 with --smoke].
    #[arg(long)]
    pub secs: Option<f64>,
    /// Seconds at the start not counted [default: 3; 0.5 with --smoke].
    #[arg(long)]
    pub warmup_secs: Option<f64>,
    /// Sessions the turns are spread over, round robin [default: 200; 10 with --smoke].
    #[arg(long)]
    pub sessions: Option<usize>,
}

/// Options of `aptix-bench inflight`.
#[derive(Debug, Clone, clap::Args)]
pub struct InflightArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Concurrent turns, one per session, closed loop [default: 1000; 40 with --smoke].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Simulator latency per call, ms [default: 2000; 200 with --smoke].
    #[arg(long)]
    pub latency_ms: Option<u64>,
    /// Seconds of load [default: 24; 2 with --smoke].
    #[arg(long)]
    pub secs: Option<f64>,
    /// Seconds at the start not counted [default: 6; 0.6 with --smoke].
    #[arg(long)]
    pub warmup_secs: Option<f64>,
    /// Run the pipeline as `aptix run` (built beside this binary) in a process of its own, a
    /// fresh one each run, so its peak memory is read apart from the load driver's.
    #[arg(long)]
    pub pipeline_process: bool,
}

/// Options of `aptix-bench scaling`.
#[derive(Debug, Clone, clap::Args)]
pub struct ScalingArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// The stage to scale [default: the one with the deepest input queue in the 1-copy run].
    #[arg(long)]
    pub stage: Option<String>,
    /// Copies of that stage to measure, comma-separated [default: 1,2,4; 1,2 with --smoke].
    #[arg(long, value_delimiter = ',')]
    pub copies: Option<Vec<usize>>,
    /// Seconds of load per point [default: 15; 1.5 with --smoke].
    #[arg(long)]
    pub secs: Option<f64>,
    /// Seconds at the start of each point not counted [default: 3; 0.5 with --smoke].
    #[arg(long)]
    pub warmup_secs: Option<f64>,
    /// Sessions, closed loop [default: 256; 8 with --smoke].
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Simulator latency per call, ms. With a low `pipeline.prefetch.invoke` this makes invoke
    /// the concurrency-bound stage that copies relieve [default: 0].
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
}

/// Options of `aptix-bench growth`.
#[derive(Debug, Clone, clap::Args)]
pub struct GrowthArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Points as SESSIONSxFILE_BYTES, comma-separated [default:
    /// 100x1000,1000x1000,10000x1000,100x100000,1000x100000; 4x1000,8x20000 with --smoke].
    #[arg(long, value_delimiter = ',', value_parser = parse_point)]
    pub points: Option<Vec<(usize, usize)>>,
    /// Seconds of load per point [default: 20; 2 with --smoke].
    #[arg(long)]
    pub secs: Option<f64>,
    /// Seconds at the start of each point not counted, over which the sessions start [default:
    /// 5; 0.5 with --smoke].
    #[arg(long)]
    pub warmup_secs: Option<f64>,
}

fn parse_point(s: &str) -> Result<(usize, usize), String> {
    let (sessions, bytes) = s.split_once('x').ok_or("a point is SESSIONSxFILE_BYTES")?;
    let n = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("{v}: {e}"));
    Ok((n(sessions)?.max(1), n(bytes)?))
}

/// Options of `aptix-bench all`: the four pipeline benchmarks with their defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct AllArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

fn pick<T>(explicit: Option<T>, smoke: bool, small: T, full: T) -> T {
    explicit.unwrap_or(if smoke { small } else { full })
}

/// Resolved sizes of each benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Ceiling {
    pub(crate) secs: f64,
    pub(crate) warmup: f64,
    pub(crate) sessions: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Overhead {
    pub(crate) rate: f64,
    pub(crate) secs: f64,
    pub(crate) warmup: f64,
    pub(crate) sessions: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Inflight {
    pub(crate) concurrency: usize,
    pub(crate) latency_ms: u64,
    pub(crate) secs: f64,
    pub(crate) warmup: f64,
    pub(crate) pipeline_process: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Scaling {
    pub(crate) stage: Option<String>,
    pub(crate) copies: Vec<usize>,
    pub(crate) secs: f64,
    pub(crate) warmup: f64,
    pub(crate) sessions: usize,
    pub(crate) latency_ms: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Growth {
    pub(crate) points: Vec<(usize, usize)>,
    pub(crate) secs: f64,
    pub(crate) warmup: f64,
}

impl GrowthArgs {
    pub(crate) fn resolve(&self) -> Growth {
        let s = self.common.smoke;
        let full = vec![(100, 1000), (1000, 1000), (10_000, 1000), (100, 100_000), (1000, 100_000)];
        Growth {
            points: pick(self.points.clone(), s, vec![(4, 1000), (8, 20_000)], full),
            secs: pick(self.secs, s, 2.0, 20.0),
            warmup: pick(self.warmup_secs, s, 0.5, 5.0),
        }
    }
}

impl CeilingArgs {
    pub(crate) fn resolve(&self) -> Ceiling {
        let s = self.common.smoke;
        Ceiling {
            secs: pick(self.secs, s, 2.0, 20.0),
            warmup: pick(self.warmup_secs, s, 0.5, 3.0),
            sessions: pick(self.sessions, s, 8, 256).max(1),
        }
    }
}

impl OverheadArgs {
    pub(crate) fn resolve(&self) -> Overhead {
        let s = self.common.smoke;
        Overhead {
            rate: pick(self.rate, s, 20.0, 100.0).max(0.1),
            secs: pick(self.secs, s, 2.0, 30.0),
            warmup: pick(self.warmup_secs, s, 0.5, 3.0),
            sessions: pick(self.sessions, s, 10, 200).max(1),
        }
    }
}

impl InflightArgs {
    pub(crate) fn resolve(&self) -> Inflight {
        let s = self.common.smoke;
        Inflight {
            concurrency: pick(self.concurrency, s, 40, 1000).max(1),
            latency_ms: pick(self.latency_ms, s, 200, 2000),
            secs: pick(self.secs, s, 2.0, 24.0),
            warmup: pick(self.warmup_secs, s, 0.6, 6.0),
            pipeline_process: self.pipeline_process,
        }
    }
}

impl ScalingArgs {
    pub(crate) fn resolve(&self) -> Scaling {
        let s = self.common.smoke;
        let mut copies = pick(self.copies.clone(), s, vec![1, 2], vec![1, 2, 4]);
        copies.retain(|c| *c > 0);
        if copies.is_empty() {
            copies.push(1);
        }
        Scaling {
            stage: self.stage.clone(),
            copies,
            secs: pick(self.secs, s, 1.5, 15.0),
            warmup: pick(self.warmup_secs, s, 0.5, 3.0),
            sessions: pick(self.sessions, s, 8, 256).max(1),
            latency_ms: self.latency_ms,
        }
    }
}
