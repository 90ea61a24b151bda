//! `aptix-bench fairness`: one tenant's flood against another's normal load (issue 17, point
//! 4). Two tenants share one pipeline: A (the configured broker user) with a turns-per-minute
//! limit, B (a user this benchmark creates, `aptix-bench-tb`) with none. B publishes at a steady
//! open-loop rate, first alone, then while A publishes at `--flood` times its limit; the table
//! compares B's latency and throughput in both runs. Every figure comes from one run of each,
//! on the build it was run with.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use super::driver::{self, Driver, TurnIds, TurnSample};
use super::env::{BenchEnv, Corpus, EnvOptions};
use crate::Percentiles;
use aptix::config::{AgentContext, Settings, Tenant, TenantLimits};
use aptix::contracts::TenantName;
use aptix::sim::Latency;

/// Options of `aptix-bench fairness`.
#[derive(Debug, Clone, clap::Args)]
pub struct FairnessArgs {
    /// Tenant A's `turns_per_minute`.
    #[arg(long, default_value_t = 120)]
    pub limit_per_minute: u32,
    /// A publishes at this many times its limit.
    #[arg(long, default_value_t = 10.0)]
    pub flood: f64,
    /// B's steady rate, turns per second.
    #[arg(long, default_value_t = 4.0)]
    pub b_rate: f64,
    /// Seconds of each run.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// LLM latency of the simulator, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub llm_ms: u64,
    /// A few seconds, for CI.
    #[arg(long)]
    pub smoke: bool,
}

const USER_B: &str = "aptix-bench-tb";

fn ctl(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("rabbitmqctl").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `settings` with tenants `ta` (the configured user) and `tb` (`aptix-bench-tb`).
fn two_tenants(settings: &Settings, args: &FairnessArgs) -> anyhow::Result<Settings> {
    let mut s = settings.clone();
    let user_a = aptix::broker::client::url_user(s.amqp.url.expose());
    let b: AgentContext = serde_json::from_value(serde_json::json!({"collection": "bench_b"}))?;
    s.agent_contexts.insert("bench_b".into(), b);
    let tenant = |user: &str, agent: &str, per_minute: u32| -> anyhow::Result<Tenant> {
        Ok(serde_json::from_value(serde_json::json!({
            "users": [user], "agent_contexts": [agent],
            "conversation_contexts": [s.default_conversation_context],
            "limits": {"turns_per_minute": per_minute},
        }))?)
    };
    let a = tenant(&user_a, &s.default_agent_context, args.limit_per_minute)?;
    let b = tenant(USER_B, "bench_b", 0)?;
    s.tenants = [("ta".to_owned(), a), ("tb".to_owned(), b)].into();
    s.tenant_limits = TenantLimits::default();
    s.validate().context("two-tenant settings")?;
    Ok(s)
}

/// B's figures of one run.
struct Figures {
    sent: usize,
    ok: usize,
    per_second: f64,
    latency: Percentiles,
}

fn figures(samples: &[TurnSample], start: Instant, seconds: u64) -> Figures {
    let mut lat: Vec<Duration> =
        samples.iter().filter(|s| s.ok).filter_map(TurnSample::latency).collect();
    let end = start + Duration::from_secs(seconds + 10);
    Figures {
        sent: samples.len(),
        ok: lat.len(),
        per_second: driver::throughput(samples, start, end.min(Instant::now())).max(0.0),
        latency: Percentiles::of(&mut lat),
    }
}

/// Runs both runs and prints the table.
pub async fn run(args: FairnessArgs, settings: &Settings) -> anyhow::Result<bool> {
    let seconds = if args.smoke { 4 } else { args.seconds };
    let settings = two_tenants(settings, &args)?;
    ctl(&["-q", "add_user", USER_B, USER_B])
        .or_else(|_| ctl(&["-q", "change_password", USER_B, USER_B]))?;
    ctl(&["-q", "set_permissions", "-p", "/", USER_B, ".*", ".*", ".*"])?;
    let latency = Latency { fixed_ms: args.llm_ms, ..Default::default() };
    let opts = EnvOptions {
        corpus: Corpus::Fixture,
        latency,
        sim_process: false,
        pipeline_process: false,
    };
    let mut env = BenchEnv::setup(&settings, &opts).await?;
    env.start(&aptix::stages::names(), 1);
    let result = measure(&env, &args, seconds).await;
    env.teardown().await;
    let _ = ctl(&["-q", "delete_user", USER_B]);
    result
}

async fn measure(env: &BenchEnv, args: &FairnessArgs, seconds: u64) -> anyhow::Result<bool> {
    let url_a = env.settings.amqp.url.expose().to_owned();
    let url_b = format!("amqp://{USER_B}:{USER_B}@127.0.0.1:5672/%2f");
    let (ta, tb): (TenantName, TenantName) =
        ("ta".parse().map_err(anyhow::Error::msg)?, "tb".parse().map_err(anyhow::Error::msg)?);
    let ids = Arc::new(TurnIds::default());
    let b_sessions = driver::sessions(16);
    env.track_sessions(&env.topology, Some(&tb), &b_sessions);
    let b = Arc::new(
        Driver::new_as(&env.conn, &url_b, &env.topology, &b_sessions, Some(tb.clone())).await?,
    );
    let a_rate = f64::from(args.limit_per_minute) / 60.0 * args.flood;
    let a_sessions = driver::sessions(((a_rate * seconds as f64) as usize).clamp(1, 2000));
    env.track_sessions(&env.topology, Some(&ta), &a_sessions);
    let a =
        Arc::new(Driver::new_as(&env.conn, &url_a, &env.topology, &a_sessions, Some(ta)).await?);
    let duration = Duration::from_secs(seconds);
    let timeout = Duration::from_secs(60);
    let (start, alone) =
        driver::open_loop(&b, &b_sessions, &ids, args.b_rate, duration, timeout).await;
    let alone = figures(&alone, start, seconds);
    let flood = {
        let (a, a_sessions, ids) = (a.clone(), a_sessions.clone(), ids.clone());
        tokio::spawn(async move {
            driver::open_loop(&a, &a_sessions, &ids, a_rate, duration, timeout).await
        })
    };
    let (start, shared) =
        driver::open_loop(&b, &b_sessions, &ids, args.b_rate, duration, timeout).await;
    let shared = figures(&shared, start, seconds);
    let (_, a_samples) = flood.await?;
    let a_ok = a_samples.iter().filter(|s| s.ok).count();
    let a_answered = a_samples.iter().filter(|s| s.end.is_some()).count();
    println!("fairness: tenant A limited to {} turns/min publishes {a_rate:.1}/s ({}x) for {seconds} s; tenant B {:.1}/s; LLM {} ms",
        args.limit_per_minute, args.flood, args.b_rate, args.llm_ms);
    println!("  A: {} sent, {a_answered} answered, {a_ok} completed, {} refused (limit.turns_per_minute)",
        a_samples.len(), a_answered - a_ok);
    println!(
        "  {:<12} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "B", "sent", "ok", "turns/s", "p50 ms", "p95 ms", "p99 ms", "max ms"
    );
    for (name, f) in [("alone", &alone), ("with flood", &shared)] {
        let l = f.latency;
        println!(
            "  {name:<12} {:>6} {:>6} {:>9.2} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            f.sent, f.ok, f.per_second, l.p50, l.p95, l.p99, l.max
        );
    }
    println!(
        "  B's p99 with the flood / alone: {:.2}; throughput: {:.2}",
        shared.latency.p99 / alone.latency.p99.max(1e-9),
        shared.per_second / alone.per_second.max(1e-9)
    );
    if let Ok(a) = Arc::try_unwrap(a) {
        a.close().await;
    }
    if let Ok(b) = Arc::try_unwrap(b) {
        b.close().await;
    }
    Ok(alone.ok == alone.sent && shared.ok == shared.sent)
}
