//! `aptix-bench growth`: how a turn's cost grows with the work. Each point (sessions in the
//! closed loop, bytes of the active file every request carries) runs the pipeline alone in a
//! fresh environment: turns/s, CPU per turn by process, WAL per turn.

#[allow(clippy::wildcard_imports)]
use super::*;

/// `aptix-bench growth`.
pub async fn growth(
    p: &Growth,
    common: &CommonArgs,
    corpus: &Corpus,
    settings: &Settings,
) -> anyhow::Result<(Value, usize)> {
    let timeout = Duration::from_secs(common.turn_timeout_secs);
    let opts = env_options(common, corpus, 0);
    let mut merged: Vec<RunReport> = Vec::new();
    for &(sessions, file_bytes) in &p.points {
        let point = Point { sessions, file_bytes, secs: p.secs, warmup: p.warmup, timeout };
        let runs =
            repeat(common, settings, &opts, |env, i| Box::pin(point.measure(env, i))).await?;
        for (i, run) in runs.into_iter().enumerate() {
            if merged.len() <= i {
                merged.push(RunReport::default());
            }
            let into = &mut merged[i];
            into.figures.extend(run.figures);
            into.details.extend(run.details);
            into.failures += run.failures;
        }
    }
    let notes = vec![format!(
        "closed loop per point (sessions x active-file bytes), {} s each ({} s warm-up not counted, sessions starting over it); pipeline only, 1 copy per stage; simulator at zero latency",
        p.secs, p.warmup
    )];
    let doc = finish("growth", json!(p), &merged, &[], &notes);
    Ok((doc, failures(&merged)))
}

/// One point of the growth curve.
#[derive(Debug, Clone, Copy)]
struct Point {
    sessions: usize,
    file_bytes: usize,
    secs: f64,
    warmup: f64,
    timeout: Duration,
}

impl Point {
    /// The pipeline under this point's load, in `env`; figures keyed by the point.
    async fn measure(self, env: &mut BenchEnv, run: usize) -> anyhow::Result<RunReport> {
        let Point { sessions, file_bytes, secs: load_secs, warmup, timeout } = self;
        let ids = Arc::new(TurnIds::default());
        let stages = env.topology.stages().to_vec();
        env.start(&stages, 1);
        // Sessions start over the warm-up, so 10,000 do not all publish at once.
        let load =
            Load { sessions, file_bytes, secs: load_secs, warmup, ramp: secs(warmup), timeout };
        let m = measure_closed(env, &env.topology.clone(), &ids, &load).await?;
        env.stop().await;
        let key = format!("s{sessions}_f{file_bytes}_");
        let label = format!("{sessions} sessions, {file_bytes} B file: ");
        let mut r = RunReport::default();
        r.add(format!("{key}turns_per_s"), format!("{label}turns/s"), "turns/s", m.rate);
        cpu_per_turn(&mut r, &key, &label, &m.cpu, m.samples.len());
        wal_per_turn(&mut r, &key, &label, &m.wal, m.samples.len());
        r.failures = failed(&m.samples);
        r.detail(&format!("{key}turns"), m.samples.len());
        r.detail(&format!("{key}mean_ready_per_queue"), &m.depths);
        let aptix_ms = m.cpu.aptix_s * 1e3 / m.samples.len().max(1) as f64;
        println!(
            "  run {}: {sessions} sessions, {file_bytes} B file: {:.0} turns/s, aptix {aptix_ms:.2} ms CPU per turn",
            run + 1,
            m.rate
        );
        Ok(r)
    }
}
