//! A one-off throughput measurement of the simulator (loopback, bounded request count). Ignored by
//! default because it measures rather than checks; run it with
//! `CARGO_PROFILE_DEV_OPT_LEVEL=2 cargo test --test testsuite -- --ignored --nocapture sim_throughput::`
//! (optimises this crate only; dependencies are already optimised in the dev profile).

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::sim_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use serde_json::Value;
use sim_support::{first_turn, next_turn, start_sim};

const REQUESTS: usize = 20_000;
const CONCURRENCY: usize = 64;

async fn measure(label: &str, base: &str, body: Value) {
    let http = aptix::http::client().build().unwrap();
    let body = Arc::new(serde_json::to_vec(&body).expect("serializable"));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = (0..CONCURRENCY).map(|_| {
        let (http, body, next, url) =
            (http.clone(), body.clone(), next.clone(), format!("{base}/responses"));
        tokio::spawn(async move {
            let mut failed = 0;
            while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                let resp = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.to_vec())
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status().is_success() => drop(r.bytes().await),
                    _ => failed += 1,
                }
            }
            failed
        })
    });
    let failed: usize = join_all(workers).await.into_iter().map(|r| r.unwrap_or(1)).sum();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{label}: {REQUESTS} requests, {CONCURRENCY} concurrent, {secs:.2} s, {:.0} req/s, {failed} failed",
        REQUESTS as f64 / secs
    );
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "measurement; run explicitly"]
async fn simulator_throughput() {
    let sim = start_sim(None).await;
    let base = sim.base_url();
    measure("json first turn", &base, first_turn("Explain chunk 1", false)).await;
    measure("sse first turn", &base, first_turn("Explain chunk 1", true)).await;
    let stored = sim.stats().stored;
    let chain = aptix::http::client()
        .build()
        .unwrap()
        .post(format!("{base}/responses"))
        .json(&first_turn("start", false))
        .send()
        .await
        .expect("sent")
        .json::<Value>()
        .await
        .expect("json");
    let id = chain["id"].as_str().expect("id").to_owned();
    measure("json chained turn", &base, next_turn(&id, "go on", false)).await;
    println!("stored responses: {} (before chaining {stored})", sim.stats().stored);
}
