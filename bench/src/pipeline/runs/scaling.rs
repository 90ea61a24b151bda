//! `aptix-bench scaling`: throughput with 1, 2 and 4 copies of the slowest stage.

#[allow(clippy::wildcard_imports)]
use super::*;

/// `aptix-bench scaling`.
pub async fn scaling(
    p: &Scaling,
    common: &CommonArgs,
    corpus: &Corpus,
    settings: &Settings,
) -> anyhow::Result<(Value, usize)> {
    let opts = env_options(common, corpus, p.latency_ms);
    let mut stage = match &p.stage {
        Some(name) => Some(
            aptix::stages::chain()
                .find(name)
                .ok_or_else(|| anyhow::anyhow!("no stage is called `{name}`"))?,
        ),
        None => None,
    };
    let mut runs = Vec::new();
    for run in 0..common.runs.max(1) {
        let mut r = RunReport::default();
        let mut points = Vec::new();
        if stage.is_none() {
            // Find the slowest stage with one copy of everything.
            let m = point(settings, &opts, None, 1, p, common).await?;
            let s = slowest(&m.depths);
            println!("  slowest stage (deepest input queue with one copy each): {}", s.as_str());
            stage = Some(s);
            if p.copies.contains(&1) {
                points.push((1, m));
            }
        }
        let Some(s) = stage else { continue };
        for &copies in &p.copies {
            if points.iter().any(|(c, _)| *c == copies) {
                continue;
            }
            points.push((copies, point(settings, &opts, Some(s), copies, p, common).await?));
        }
        points.sort_by_key(|(c, _)| *c);
        let base = points.first().map_or(0.0, |(_, m)| m.rate);
        for (copies, m) in &points {
            let first = points.first().map_or(1, |(c, _)| *c);
            r.add(
                format!("copies_{copies}_turns_per_s"),
                format!("{} x{copies}: turns/s", s.as_str()),
                "turns/s",
                m.rate,
            );
            r.add(
                format!("copies_{copies}_speedup"),
                format!("{} x{copies}: speed-up over x{first}", s.as_str()),
                "x",
                m.rate / base.max(1e-9),
            );
            r.failures += failed(&m.samples);
            r.detail(&format!("copies_{copies}_mean_ready_per_queue"), &m.depths);
            r.detail(&format!("copies_{copies}_cpu"), m.cpu);
            r.detail(&format!("copies_{copies}_wal"), m.wal);
            println!(
                "  run {}: {} x{copies}: {:.0} turns/s, machine busy {:.0} %",
                run + 1,
                s.as_str(),
                m.rate,
                m.cpu.machine_busy * 100.0
            );
        }
        r.detail("stage", s.as_str());
        runs.push(r);
    }
    let notes = vec![format!(
        "closed loop, {} sessions, {} s per point ({} s warm-up not counted), fresh environment per point; \
         simulator latency {} ms; prefetch per copy {:?}; the other stages at one copy; all stages in this one \
         process (2 vCPUs shared with RabbitMQ and PostgreSQL)",
        p.sessions, p.secs, p.warmup, p.latency_ms, settings.pipeline.prefetch
    )];
    let doc = finish(
        "scaling",
        json!({"params": p, "stage": stage.map(|s| s.as_str())}),
        &runs,
        &[],
        &notes,
    );
    Ok((doc, failures(&runs)))
}

/// One scaling point: `copies` of `stage` (or of nothing special), the rest at one copy.
async fn point(
    settings: &Settings,
    opts: &EnvOptions,
    stage: Option<StageName>,
    copies: usize,
    p: &Scaling,
    common: &CommonArgs,
) -> anyhow::Result<Measured> {
    let timeout = Duration::from_secs(common.turn_timeout_secs);
    idle_gate(common).await;
    let mut env = BenchEnv::setup(settings, opts).await?;
    let result = async {
        match stage {
            Some(s) => {
                env.start(&[s], copies);
                let others: Vec<StageName> =
                    aptix::stages::names().into_iter().filter(|o| *o != s).collect();
                env.start(&others, 1);
            }
            None => env.start(&aptix::stages::names(), 1),
        }
        let ids = Arc::new(TurnIds::default());
        let topology = env.topology.clone();
        let load = Load {
            sessions: p.sessions,
            file_bytes: 0,
            secs: p.secs,
            warmup: p.warmup,
            ramp: Duration::ZERO,
            timeout,
        };
        measure_closed(&env, &topology, &ids, &load).await
    }
    .await;
    env.teardown().await;
    result
}
