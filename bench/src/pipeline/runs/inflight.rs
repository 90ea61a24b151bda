//! `aptix-bench inflight`: many concurrent turns at a high LLM latency through one invoke worker.

#[allow(clippy::wildcard_imports)]
use super::*;

/// `aptix-bench inflight`.
pub async fn inflight(
    p: &Inflight,
    common: &CommonArgs,
    corpus: &Corpus,
    settings: &Settings,
) -> anyhow::Result<(Value, usize)> {
    let timeout =
        Duration::from_secs(common.turn_timeout_secs).max(Duration::from_millis(p.latency_ms * 5));
    let mut opts = env_options(common, corpus, p.latency_ms);
    opts.pipeline_process = p.pipeline_process;
    let reset = sys::reset_peak_rss();
    let runs = repeat(common, settings, &opts, |env, i| {
        let p = p.clone();
        Box::pin(async move {
            sys::reset_peak_rss();
            let sim_pid = env.sim_pid().map(|p| p.to_string());
            if let Some(pid) = &sim_pid {
                sys::reset_peak_rss_of(pid);
            }
            let rss_before = sys::status_mib("VmRSS:").unwrap_or(0.0);
            env.start_all(1).await?;
            env.reset_peak();
            let ids = Arc::new(TurnIds::default());
            let topology = env.topology.clone();
            // Sessions start spread over one latency period, as steady arrivals would be.
            let ramp = Duration::from_millis(p.latency_ms);
            let load = Load { sessions: p.concurrency, file_bytes: 0, secs: p.secs, warmup: p.warmup, ramp, timeout };
            let m = measure_closed(env, &topology, &ids, &load).await?;
            let hwm = sys::status_mib("VmHWM:").unwrap_or(0.0);
            let sim_hwm = sim_pid.as_deref().and_then(|pid| sys::status_mib_of(pid, "VmHWM:"));
            let apart = env.pipeline_pid().map(|pid| pid.to_string());
            let pipeline_hwm = apart.as_deref().and_then(|pid| sys::status_mib_of(pid, "VmHWM:"));
            let pipeline_end = apart.as_deref().and_then(|pid| sys::status_mib_of(pid, "VmRSS:"));
            let peak_in_flight = env.peak_in_flight();
            env.stop().await;
            let ideal = p.concurrency as f64 / (p.latency_ms as f64 / 1e3).max(1e-3);
            let mut r = RunReport::default();
            r.add("turns_per_s", "throughput: turns/s", "turns/s", m.rate);
            r.add("ideal_turns_per_s", "concurrency / latency", "turns/s", ideal);
            r.add("efficiency_pct", "throughput / (concurrency / latency)", "%", m.rate / ideal * 100.0);
            r.add("peak_llm_in_flight", "peak LLM calls in flight", "calls", peak_in_flight as f64);
            let what = match (pipeline_hwm, sim_hwm) {
                (Some(_), _) => "peak RSS of the pipeline process, aptix run (VmHWM)",
                (None, Some(_)) => "peak RSS of the process: pipeline and driver (VmHWM)",
                (None, None) => "peak RSS of the process: pipeline, driver and simulator (VmHWM)",
            };
            r.add("peak_rss_mib", what, "MiB", pipeline_hwm.unwrap_or(hwm));
            if pipeline_hwm.is_some() {
                r.add("driver_peak_rss_mib", "peak RSS of the driver process (VmHWM)", "MiB", hwm);
            }
            if let Some(sim_hwm) = sim_hwm {
                r.add("sim_peak_rss_mib", "peak RSS of the simulator process (VmHWM)", "MiB", sim_hwm);
            }
            r.add("rss_at_start_mib", "RSS when the run started", "MiB", rss_before);
            if let Some(rss) = pipeline_end {
                r.add("pipeline_rss_at_end_mib", "RSS of the pipeline process at the end", "MiB", rss);
            }
            r.add("machine_busy", "machine CPU busy", "%", m.cpu.machine_busy * 100.0);
            cpu_per_turn(&mut r, "", "", &m.cpu, m.samples.len());
            wal_per_turn(&mut r, "", "", &m.wal, m.samples.len());
            r.failures = failed(&m.samples);
            r.detail("mean_ready_per_queue", &m.depths);
            r.detail("cpu", m.cpu);
            r.detail("turns", m.samples.len());
            println!(
                "  run {}: {:.0} turns/s of {:.0} ideal ({:.0} %), peak in flight {}, VmHWM {:.0} MiB",
                i + 1,
                m.rate,
                ideal,
                m.rate / ideal * 100.0,
                peak_in_flight,
                pipeline_hwm.unwrap_or(hwm)
            );
            Ok(r)
        })
    })
    .await?;
    let covers = match (p.pipeline_process, common.sim_process) {
        (true, _) => "the pipeline process alone (aptix run, a fresh process each run; peak calls in \
                      flight sampled from its metrics every 100 ms)",
        (false, true) => "the benchmark process: pipeline and load driver (the simulator is a process of its own)",
        (false, false) => "the benchmark process: pipeline and load driver, and the simulator",
    };
    let mut notes = vec![format!(
        "closed loop: {} sessions with one turn in flight each, simulator latency {} ms, one copy of every stage, \
         invoke prefetch {}; {} s ({} s warm-up not counted). VmHWM covers {covers}",
        p.concurrency,
        p.latency_ms,
        settings.pipeline.prefetch.get("invoke"),
        p.secs,
        p.warmup,
    )];
    if usize::from(settings.pipeline.prefetch.get("invoke")) < p.concurrency {
        notes.push(format!(
            "invoke prefetch {} is below the concurrency {}: at most that many calls can be in flight",
            settings.pipeline.prefetch.get("invoke"),
            p.concurrency
        ));
    }
    if !reset {
        notes.push(
            "could not reset VmHWM (/proc/self/clear_refs): the peak covers the whole process life"
                .into(),
        );
    }
    // Issue 46: >= 400 turns/s with 1,000 sessions at 2 s, under 250 MB (238.4 MiB) for the
    // pipeline process (the figure is only the pipeline's with --pipeline-process).
    let targets = [
        Target::AtLeast("turns_per_s", 400.0),
        Target::AtLeast("efficiency_pct", 90.0),
        Target::Below("peak_rss_mib", 238.4),
    ];
    let doc = finish("inflight", json!(p), &runs, &targets, &notes);
    Ok((doc, failures(&runs)))
}
