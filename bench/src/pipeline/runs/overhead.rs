//! `aptix-bench overhead`: publish to final reply minus the LLM call, at a steady open-loop rate, and where the time goes.

use super::stage_times::{self, StoredPath};
#[allow(clippy::wildcard_imports)]
use super::*;

/// `aptix-bench overhead`.
pub async fn overhead(
    p: &Overhead,
    common: &CommonArgs,
    corpus: &Corpus,
    settings: &Settings,
) -> anyhow::Result<(Value, usize)> {
    let timeout = Duration::from_secs(common.turn_timeout_secs);
    let opts = env_options(common, corpus, 0);
    let runs = repeat(common, settings, &opts, |env, i| {
        let p = p.clone();
        Box::pin(async move {
            let ids = Arc::new(TurnIds::default());
            let relay = relay_latency(env, &ids, &p, timeout).await?;
            env.start(&aptix::stages::names(), 1);
            let sessions = driver::sessions(p.sessions);
            let topology = env.topology.clone();
            env.track_sessions(&topology, None, &sessions);
            let driver = Arc::new(Driver::new(&env.conn, env.settings.amqp.url.expose(), &topology, &sessions).await?);
            let pool = env.deps.store.pool();
            let (before, wal_before) = (CpuSnapshot::take(&env.cpu_sources()), Wal::take(pool).await);
            let (start, samples) = driver::open_loop(&driver, &sessions, &ids, p.rate, secs(p.secs), timeout).await;
            let cpu = CpuSnapshot::take(&env.cpu_sources()).since(&before);
            let wal = Wal::take(pool).await.since(&wal_before);
            if let Ok(d) = Arc::try_unwrap(driver) {
                d.close().await;
            }
            env.stop().await;
            let from = start + secs(p.warmup.min(p.secs * 0.5));
            let counted: Vec<&TurnSample> = samples.iter().filter(|s| s.start >= from && s.ok).collect();
            let (mut e2e, mut llm, mut over) = (Vec::new(), Vec::new(), Vec::new());
            for s in &counted {
                let Some(total) = s.latency() else { continue };
                let call = env.llm.call_time(&s.turn_id).unwrap_or_default();
                e2e.push(total);
                llm.push(call);
                over.push(total.saturating_sub(call));
            }
            let (e, l, o) = (Percentiles::of(&mut e2e), Percentiles::of(&mut llm), Percentiles::of(&mut over));
            let mut r = RunReport::default();
            let last = samples.iter().filter_map(|s| s.end).max().unwrap_or(start);
            r.add("achieved_rate", "replies/s over the run", "turns/s", samples.iter().filter(|s| s.ok).count() as f64 / last.saturating_duration_since(start).as_secs_f64().max(1e-9));
            r.add("overhead_p50_ms", "overhead p50 (e2e minus LLM call)", "ms", o.p50);
            r.add("overhead_p99_ms", "overhead p99 (e2e minus LLM call)", "ms", o.p99);
            r.add("overhead_max_ms", "overhead max", "ms", o.max);
            r.add("e2e_p50_ms", "publish to final reply p50", "ms", e.p50);
            r.add("e2e_p99_ms", "publish to final reply p99", "ms", e.p99);
            r.add("llm_p50_ms", "LLM call (HTTP to simulator) p50", "ms", l.p50);
            r.add("llm_p99_ms", "LLM call (HTTP to simulator) p99", "ms", l.p99);
            r.add("relay_e2e_p50_ms", "relay at the same rate (5 queues, no work): publish to reply p50", "ms", relay.e2e.p50);
            r.add("relay_e2e_p99_ms", "relay at the same rate: publish to reply p99", "ms", relay.e2e.p99);
            r.add("relay_driver_late_p50_ms", "relay at the same rate: scheduled -> driver starts publishing p50", "ms", relay.late.p50);
            let mut late: Vec<Duration> = counted.iter().map(|s| s.late).collect();
            r.add("driver_late_p50_ms", "scheduled -> driver starts publishing p50 (in e2e and overhead)", "ms", Percentiles::of(&mut late).p50);
            cpu_per_turn(&mut r, "relay_", "relay at the same rate: ", &relay.cpu, relay.turns);
            r.add("machine_busy", "machine CPU busy", "%", cpu.machine_busy * 100.0);
            cpu_per_turn(&mut r, "", "", &cpu, samples.len());
            let all_in = |c: &CpuUse, n: usize| (c.aptix_s + c.rabbitmq_s + c.postgres_s) / n.max(1) as f64;
            let vs_relay = all_in(&cpu, samples.len()) / all_in(&relay.cpu, relay.turns).max(1e-12);
            r.add("cpu_vs_relay", "CPU per turn, all in, over the relay's at the same rate", "ratio", vs_relay);
            wal_per_turn(&mut r, "", "", &wal, samples.len());
            r.failures = failed(&samples) + relay.failures;
            let segments = breakdown(env, &counted).await;
            for (i, (key, label)) in SEGMENTS.iter().enumerate() {
                let mut v = segments.get(i).cloned().unwrap_or_default();
                let pc = Percentiles::of(&mut v);
                r.add(format!("{key}_p50_ms"), format!("{label} p50"), "ms", pc.p50);
                r.add(format!("{key}_p99_ms"), format!("{label} p99"), "ms", pc.p99);
            }
            for (key, label, mean) in stage_times::breakdown(&stored_paths(env, &counted).await) {
                r.add(key, label, "ms", mean);
            }
            r.detail("counted_turns", counted.len());
            r.detail("cpu", cpu);
            println!(
                "  run {}: {} turns counted; overhead p50 {:.1} ms p99 {:.1} ms; e2e p50 {:.1} ms p99 {:.1} ms; relay p50 {:.1} ms p99 {:.1} ms",
                i + 1,
                counted.len(),
                o.p50,
                o.p99,
                e.p50,
                e.p99,
                relay.e2e.p50,
                relay.e2e.p99
            );
            Ok(r)
        })
    })
    .await?;
    let notes = vec![format!(
        "open loop at {} turns/s for {} s over {} sessions ({} s warm-up not counted); simulator at zero latency; \
         latency from each turn's scheduled publish time; overhead = e2e minus the invoke stage's LLM call time; \
         first the relay (messages of the pipeline's sizes through the same five queues, no work) at the same rate",
        p.rate, p.secs, p.sessions, p.warmup
    )];
    // Issue 46's targets at 100 turns/s (docs/benchmarks.md).
    let targets = [
        Target::AtMost("overhead_p50_ms", 6.0),
        Target::AtMost("overhead_p99_ms", 15.0),
        Target::AtMost("cpu_vs_relay", 1.5),
    ];
    let doc = finish("overhead", json!(p), &runs, &targets, &notes);
    Ok((doc, failures(&runs)))
}

/// The relay under the same open-loop load: what the five hops cost in latency on this broker
/// with the delivery contract alone (persistent, confirmed, acked after the next hop), the
/// floor under the pipeline's overhead, and what the broker spends per turn at this rate.
async fn relay_latency(
    env: &mut BenchEnv,
    ids: &Arc<TurnIds>,
    p: &Overhead,
    timeout: Duration,
) -> anyhow::Result<RelayLatency> {
    let relay = RelayRun::start(env, ids).await?;
    let sessions = driver::sessions(p.sessions);
    env.track_sessions(&relay.topology, None, &sessions);
    let url = env.settings.amqp.url.expose();
    let driver = Arc::new(Driver::new(&env.conn, url, &relay.topology, &sessions).await?);
    let before = CpuSnapshot::take(&env.cpu_sources());
    let (start, samples) =
        driver::open_loop(&driver, &sessions, ids, p.rate, secs(p.secs), timeout).await;
    let cpu = CpuSnapshot::take(&env.cpu_sources()).since(&before);
    if let Ok(d) = Arc::try_unwrap(driver) {
        d.close().await;
    }
    relay.stop().await;
    let from = start + secs(p.warmup.min(p.secs * 0.5));
    let counted: Vec<&TurnSample> = samples.iter().filter(|s| s.start >= from && s.ok).collect();
    let mut e2e: Vec<Duration> = counted.iter().filter_map(|s| s.latency()).collect();
    let mut late: Vec<Duration> = counted.iter().map(|s| s.late).collect();
    Ok(RelayLatency {
        e2e: Percentiles::of(&mut e2e),
        late: Percentiles::of(&mut late),
        cpu,
        turns: samples.len(),
        failures: failed(&samples),
    })
}

/// The relay's figures under the overhead's load.
struct RelayLatency {
    e2e: Percentiles,
    /// The driver's lateness behind each turn's scheduled time.
    late: Percentiles,
    cpu: CpuUse,
    turns: usize,
    failures: usize,
}

/// Where a turn's time goes, from database timestamps (`now()` is a transaction's start):
/// turns.created_at (admission), llm_results.created_at (the answer saved by invoke),
/// response_records.created_at (persist's transaction).
const SEGMENTS: [(&str, &str); 4] = [
    ("seg_admit", "  publish -> admission transaction (validate)"),
    ("seg_to_llm_saved", "  admission -> LLM answer saved, minus LLM call"),
    ("seg_to_persist", "  LLM answer saved -> persist transaction"),
    ("seg_to_reply", "  persist transaction -> reply at client"),
];

async fn breakdown(env: &BenchEnv, counted: &[&TurnSample]) -> Vec<Vec<Duration>> {
    type Row = (
        String,
        String,
        chrono::DateTime<chrono::Utc>,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT t.session_id::text, t.turn_id, t.created_at, l.created_at, r.created_at
         FROM turns t
         LEFT JOIN llm_results l ON l.session_id = t.session_id AND l.turn_id = t.turn_id AND l.step = 0
         LEFT JOIN response_records r ON r.session_id = t.session_id AND r.turn_id = t.turn_id AND r.step = 0",
    )
    .fetch_all(env.deps.store.pool())
    .await
    .unwrap_or_default();
    let by_key: std::collections::HashMap<(String, String), &Row> =
        rows.iter().map(|r| ((r.0.clone(), r.1.clone()), r)).collect();
    let mut out = vec![Vec::new(); SEGMENTS.len()];
    let gap = |a: chrono::DateTime<chrono::Utc>, b: chrono::DateTime<chrono::Utc>| {
        (b - a).to_std().unwrap_or_default()
    };
    for s in counted {
        let (Some(end), Some(row)) =
            (s.end, by_key.get(&(s.session.to_string(), s.turn_id.clone())))
        else {
            continue;
        };
        let (Some(saved), Some(persisted)) = (row.3, row.4) else { continue };
        let wall_end = s.wall_start
            + chrono::Duration::from_std(end.saturating_duration_since(s.start))
                .unwrap_or_default();
        let call = env.llm.call_time(&s.turn_id).unwrap_or_default();
        out[0].push(gap(s.wall_start, row.2));
        out[1].push(gap(row.2, saved).saturating_sub(call));
        out[2].push(gap(saved, persisted));
        out[3].push(gap(persisted, wall_end));
    }
    out
}

/// The stored path of each counted turn's first round trip, with admission's and persist's
/// transaction starts truncated to milliseconds as the path's own times are.
async fn stored_paths(env: &BenchEnv, counted: &[&TurnSample]) -> Vec<StoredPath> {
    let rows: Vec<(String, String, i64, i64, Value)> = sqlx::query_as(
        "SELECT t.session_id::text, t.turn_id,
                floor(extract(epoch FROM t.created_at) * 1000)::int8,
                floor(extract(epoch FROM r.created_at) * 1000)::int8, r.stage_timings::jsonb
         FROM turns t JOIN response_records r
           ON r.session_id = t.session_id AND r.turn_id = t.turn_id AND r.step = 0
         WHERE r.stage_timings IS NOT NULL",
    )
    .fetch_all(env.deps.store.pool())
    .await
    .unwrap_or_else(|error| {
        tracing::warn!(%error, "could not read the records' paths; no means by stage");
        Vec::new()
    });
    let wanted: std::collections::HashSet<(String, &str)> =
        counted.iter().map(|s| (s.session.to_string(), s.turn_id.as_str())).collect();
    rows.into_iter()
        .filter(|r| wanted.contains(&(r.0.clone(), r.1.as_str())))
        .map(|(_, _, admitted_ms, persisted_ms, timings)| StoredPath {
            admitted_ms,
            persisted_ms,
            timings,
        })
        .collect()
}
