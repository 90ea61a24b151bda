//! The metrics and health endpoints reflect real work: stage counts, LLM calls and tokens, and
//! readiness that follows the broker connection.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{new_session, user_turn, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_and_health_follow_the_pipeline() {
    let mut h = Harness::start(1).await;
    // Bound here and kept: a port chosen and released could be taken by another test's server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap().to_string();
    tokio::spawn(aptix::metrics::serve_on(
        listener,
        Some(std::sync::Arc::new(h.deps.store.clone())),
        None,
        h.shutdown.clone(),
    ));
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "count me")).await;
    assert_eq!(h.replies(&s, 1, Duration::from_secs(60)).await.len(), 1);

    let client = aptix::http::client().build().unwrap();
    let get = |path: &str| client.get(format!("http://{listen}{path}")).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    let text = get("/metrics").await.unwrap().text().await.unwrap();
    for needle in [
        r#"aptix_stage_messages_total{stage="persist",outcome="forwarded"}"#,
        r#"aptix_stage_messages_total{stage="validate",outcome="forwarded"}"#,
        r#"aptix_llm_calls_total{model="gpt-5.1",outcome="ok"}"#,
        r#"aptix_llm_tokens_total{model="gpt-5.1",kind="input"}"#,
        "aptix_stage_duration_seconds_bucket",
        r#"aptix_llm_estimated_cost_micro_usd_total{model="gpt-5.1"}"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }

    // Prometheus's own checker accepts what a live worker serves: the text is kept for
    // `deploy/prometheus/check.sh metrics FILE` (.ci/run), and checked here when promtool is
    // installed (check.sh installs it).
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("metrics.txt"), &text).unwrap();
    promtool_accepts(&text);

    // A model name from a message (a forged invoke body, a provider's answer) is no label value
    // unless configured: it is counted as `other`, and its text never reaches /metrics.
    let forged = "forged-model\"} 1\naptix_injected_total{x=\"y";
    let usage = aptix::contracts::Usage { input_tokens: 7, output_tokens: 3, ..Default::default() };
    let prices = h.settings.telemetry.prices.clone();
    aptix::metrics::metrics().llm_call(
        forged,
        "ok",
        Some(Duration::from_millis(40)),
        Some(&usage),
        &prices,
    );
    aptix::metrics::metrics().llm_call("gpt-unconfigured", "llm.rejected", None, None, &prices);
    let text = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(!text.contains("forged-model") && !text.contains("injected"), "{text}");
    assert!(!text.contains("gpt-unconfigured"), "{text}");
    for needle in [
        r#"aptix_llm_calls_total{model="other",outcome="ok"}"#,
        r#"aptix_llm_calls_total{model="other",outcome="llm.rejected"}"#,
        r#"aptix_llm_tokens_total{model="other",kind="input"}"#,
        r#"aptix_llm_calls_total{model="gpt-5.1",outcome="ok"}"#,
        r#"aptix_llm_call_duration_seconds_bucket{le="0.05",model="other",outcome="ok"} 1"#,
        r#"aptix_llm_call_duration_seconds_count{model="gpt-5.1",outcome="ok"}"#,
        r#"aptix_llm_http_responses_total{status="200"}"#,
        r#"aptix_dependency_up{dependency="broker"} 1"#,
        r#"aptix_dependency_up{dependency="database"} 1"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    // Without consumers the process is alive but not ready.
    h.stop_consumers().await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port2 = listener.local_addr().unwrap().port();
    tokio::spawn(aptix::metrics::serve_on(
        listener,
        Some(std::sync::Arc::new(h.deps.store.clone())),
        None,
        shutdown.clone(),
    ));
    let ready = client.get(format!("http://127.0.0.1:{port2}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready.text().await.unwrap().contains("broker: down"));
    let scraped = client.get(format!("http://127.0.0.1:{port2}/metrics")).send().await.unwrap();
    let text = scraped.text().await.unwrap();
    assert!(text.contains(r#"aptix_dependency_up{dependency="broker"} 0"#), "{text}");
    shutdown.cancel();
    h.teardown().await;
}

/// Runs `promtool check metrics` on `text` when promtool is installed (CI installs it).
fn promtool_accepts(text: &str) {
    use std::io::Write as _;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        assert!(std::env::var_os("CI").is_none(), "promtool is missing in CI");
        eprintln!("promtool not installed: the metrics text was not checked by it");
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check metrics: {said}\n{text}");
}
