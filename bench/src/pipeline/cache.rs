//! `aptix-bench cache`: the share of input tokens the provider's prompt cache serves, with the
//! session's `prompt_cache_key` and without one (issue 43, point 4). Each arm runs the whole
//! pipeline against the simulator, whose cache follows the provider's guide (`aptix::sim`'s
//! `cache` module): `--sessions` sessions of `--turns` turns each, concurrently, every session
//! pacing its turns `--pace-ms` apart, as a person or a tool loop would. Sessions share one boot
//! prompt, so without a key they share one routing bucket.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::driver::{self, Driver, TurnIds, TurnSample};
use super::env::{BenchEnv, Corpus, EnvOptions};
use aptix::config::{PromptCacheKey, Settings};
use aptix::sim::Latency;

/// Options of `aptix-bench cache`.
#[derive(Debug, Clone, clap::Args)]
pub struct CacheArgs {
    /// Sessions running at once.
    #[arg(long, default_value_t = 40)]
    pub sessions: usize,
    /// Turns of each session.
    #[arg(long, default_value_t = 20)]
    pub turns: usize,
    /// Time from one turn's start to the next one's in a session, milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub pace_ms: u64,
    /// LLM latency of the simulator, milliseconds.
    #[arg(long, default_value_t = 200)]
    pub llm_ms: u64,
    /// A few seconds, for CI.
    #[arg(long)]
    pub smoke: bool,
}

/// One arm's figures.
struct Arm {
    key: PromptCacheKey,
    turns: usize,
    ok: usize,
    input: u64,
    cached: u64,
    /// Input and cached tokens of turns after each session's first.
    later: (u64, u64),
}

impl Arm {
    fn share(input: u64, cached: u64) -> f64 {
        if input == 0 {
            0.0
        } else {
            cached as f64 * 100.0 / input as f64
        }
    }
}

/// Runs both arms and prints the table; `false` when a turn failed.
pub async fn run(args: CacheArgs, settings: &Settings) -> anyhow::Result<bool> {
    let args = if args.smoke {
        CacheArgs { sessions: 3, turns: 3, pace_ms: 0, llm_ms: 0, ..args }
    } else {
        args
    };
    let mut arms = Vec::new();
    for key in [PromptCacheKey::Session, PromptCacheKey::Off] {
        let mut settings = settings.clone();
        settings.assemble.prompt_cache_key = key;
        let opts = EnvOptions {
            corpus: Corpus::Fixture,
            latency: Latency { fixed_ms: args.llm_ms, ..Default::default() },
            sim_process: false,
            pipeline_process: false,
        };
        let mut env = BenchEnv::setup(&settings, &opts).await?;
        env.start(&aptix::stages::names(), 1);
        let samples = arm(&env, &args).await;
        env.teardown().await;
        arms.push(figures(key, &samples?, args.turns));
    }
    println!(
        "cache: {} sessions x {} turns, one turn per session every {} ms, LLM {} ms; the simulator's prompt cache (16 machines, 15 requests a minute per routing bucket)",
        args.sessions, args.turns, args.pace_ms, args.llm_ms
    );
    println!(
        "  {:<18} {:>6} {:>6} {:>12} {:>12} {:>9} {:>16}",
        "prompt_cache_key",
        "turns",
        "ok",
        "input tok",
        "cached tok",
        "cached %",
        "after 1st turn %"
    );
    for a in &arms {
        let key = serde_json::to_value(a.key)?;
        println!(
            "  {:<18} {:>6} {:>6} {:>12} {:>12} {:>9.1} {:>16.1}",
            key.as_str().unwrap_or("?"),
            a.turns,
            a.ok,
            a.input,
            a.cached,
            Arm::share(a.input, a.cached),
            Arm::share(a.later.0, a.later.1)
        );
    }
    Ok(arms.iter().all(|a| a.ok == a.turns))
}

/// Every session's turns, paced, all sessions at once.
async fn arm(env: &BenchEnv, args: &CacheArgs) -> anyhow::Result<Vec<TurnSample>> {
    let sessions = driver::sessions(args.sessions);
    let amqp = env.settings.amqp.url.expose().to_owned();
    env.track_sessions(&env.topology, None, &sessions);
    let driver = Arc::new(Driver::new(&env.conn, &amqp, &env.topology, &sessions).await?);
    let ids = Arc::new(TurnIds::default());
    let start = Instant::now();
    let timeout = Duration::from_secs(60);
    let mut tasks = Vec::new();
    for (i, session) in sessions.iter().copied().enumerate() {
        let (driver, ids, turns) = (driver.clone(), ids.clone(), args.turns);
        let pace = Duration::from_millis(args.pace_ms);
        // Sessions start spread over one pace, as independent users would.
        let offset = pace.mul_f64(i as f64 / args.sessions.max(1) as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let mut out = Vec::new();
            for _ in 0..turns {
                let began = Instant::now();
                out.push(driver.turn(&session, &ids.next(), start, timeout).await);
                tokio::time::sleep(pace.saturating_sub(began.elapsed())).await;
            }
            out
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await?);
    }
    if let Ok(d) = Arc::try_unwrap(driver) {
        d.close().await;
    }
    Ok(samples)
}

fn figures(key: PromptCacheKey, samples: &[TurnSample], turns: usize) -> Arm {
    let sum = |it: &mut dyn Iterator<Item = &TurnSample>| {
        it.fold((0, 0), |(i, c), s| (i + s.tokens.input, c + s.tokens.cached))
    };
    let (input, cached) = sum(&mut samples.iter());
    // Samples are in session order, `turns` per session: the first of each has nothing to hit.
    let later =
        sum(&mut samples.iter().enumerate().filter(|(i, _)| i % turns != 0).map(|(_, s)| s));
    Arm {
        key,
        turns: samples.len(),
        ok: samples.iter().filter(|s| s.ok).count(),
        input,
        cached,
        later,
    }
}
