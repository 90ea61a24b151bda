//! A worker process SIGKILLed mid-turn and restarted: the turn still completes with exactly one
//! record and one reply. Also: SIGTERM lets a worker finish in-flight work and exit cleanly.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aptix::sim::Latency;
use common::{new_session, terminate, user_turn, Harness};

async fn wait_for(mut cond: impl FnMut() -> bool, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_mid_turn_then_restarted_completes_once() {
    let h = Harness::start(0).await;
    h.sim.set_latency(Latency { fixed_ms: 1500, jitter_ms: 0, per_event_ms: 0 });
    let s = new_session();
    let mut worker = h.spawn_child(&["run"]);
    h.submit(&user_turn(&s, "t1", "survive a crash")).await;
    assert!(
        wait_for(|| !h.sim.requests().is_empty(), Duration::from_secs(60)).await,
        "the LLM was never called"
    );
    worker.kill().unwrap(); // SIGKILL, while the LLM call is in flight
    worker.wait().unwrap();
    h.sim.set_latency(Latency::default());
    let mut worker = h.spawn_child(&["run"]);
    let replies = h.replies(&s, 1, Duration::from_secs(90)).await;
    assert_eq!(replies.iter().filter(|r| r.is_final).count(), 1, "{replies:?}");
    assert_eq!(replies[0].body["Successful"], true, "{:?}", replies[0].body);
    assert_eq!(h.records(&s).await.len(), 1);
    // Nothing else arrives later: no second reply.
    let late = h.replies(&s, 1, Duration::from_secs(2)).await;
    assert!(late.is_empty(), "{late:?}");
    let status = terminate(&mut worker);
    assert!(status.success(), "SIGTERM should stop the worker cleanly: {status:?}");
    h.teardown().await;
}
