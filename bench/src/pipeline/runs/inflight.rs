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
    let opts = env_options(common, corpus, p.latency_ms);
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
            env.start(&aptix::stages::names(), 1);
            env.llm.reset_peak();
            let ids = Arc::new(TurnIds::default());
            let topology = env.topology.clone();
            // Sessions start spread over one latency period, as steady arrivals would be.
            let ramp = Duration::from_millis(p.latency_ms);
            let load = Load { sessions: p.concurrency, file_bytes: 0, secs: p.secs, warmup: p.warmup, ramp, timeout };
            let m = measure_closed(env, &topology, &ids, &load).await?;
            let hwm = sys::status_mib("VmHWM:").unwrap_or(0.0);
            let sim_hwm = sim_pid.as_deref().and_then(|pid| sys::status_mib_of(pid, "VmHWM:"));
            env.stop().await;
            let ideal = p.concurrency as f64 / (p.latency_ms as f64 / 1e3).max(1e-3);
            let mut r = RunReport::default();
            r.add("turns_per_s", "throughput: turns/s", "turns/s", m.rate);
            r.add("ideal_turns_per_s", "concurrency / latency", "turns/s", ideal);
            r.add("efficiency_pct", "throughput / (concurrency / latency)", "%", m.rate / ideal * 100.0);
            r.add("peak_llm_in_flight", "peak LLM calls in flight", "calls", env.llm.peak_in_flight() as f64);
            let what = if sim_hwm.is_some() {
                "peak RSS of the process: pipeline and driver (VmHWM)"
            } else {
                "peak RSS of the process: pipeline, driver and simulator (VmHWM)"
            };
            r.add("peak_rss_mib", what, "MiB", hwm);
            if let Some(sim_hwm) = sim_hwm {
                r.add("sim_peak_rss_mib", "peak RSS of the simulator process (VmHWM)", "MiB", sim_hwm);
            }
            r.add("rss_at_start_mib", "RSS when the run started", "MiB", rss_before);
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
                env.llm.peak_in_flight(),
                hwm
            );
            Ok(r)
        })
    })
    .await?;
    let mut notes = vec![format!(
        "closed loop: {} sessions with one turn in flight each, simulator latency {} ms, one copy of every stage, \
         invoke prefetch {}; {} s ({} s warm-up not counted). VmHWM covers the benchmark process: \
         pipeline and load driver{}",
        p.concurrency,
        p.latency_ms,
        settings.pipeline.prefetch.get("invoke"),
        p.secs,
        p.warmup,
        if common.sim_process { " (the simulator is a process of its own)" } else { ", and the simulator" }
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
    // 250 MB (issue 18) in MiB; the figure is only the pipeline's with --sim-process.
    let targets = [Target::AtLeast("efficiency_pct", 90.0), Target::Below("peak_rss_mib", 238.4)];
    let doc = finish("inflight", json!(p), &runs, &targets, &notes);
    Ok((doc, failures(&runs)))
}
