//! A worker process SIGKILLed mid-turn and restarted: the turn still completes with exactly one
//! record and one reply. Also: SIGTERM lets a worker finish in-flight work and exit cleanly.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

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

/// A turn whose worker was SIGKILLed mid-stream is cancelled while no worker runs: the
/// redelivered invoke message finds the cancel and never calls the provider again, and the turn
/// ends with exactly one `turn.cancelled` reply and one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_turn_is_not_resurrected_by_its_redelivered_message() {
    let h = Harness::start(0).await;
    h.sim.set_latency(Latency { fixed_ms: 0, jitter_ms: 0, per_event_ms: 100 });
    let s = new_session();
    let mut worker = h.spawn_child(&["run"]);
    let mut t1 = user_turn(&s, "t1", &"explain the invoice mail path in detail ".repeat(20));
    t1["Stream"] = serde_json::json!(true);
    h.submit(&t1).await;
    assert!(
        wait_for(|| !h.sim.requests().is_empty(), Duration::from_secs(60)).await,
        "the LLM was never called"
    );
    worker.kill().unwrap(); // SIGKILL, while the call streams
    worker.wait().unwrap();

    let body = serde_json::to_vec(&serde_json::json!({"SessionId": s, "TurnId": "t1"})).unwrap();
    let mut cancel = h.topology.request(&s, uuid::Uuid::new_v4().to_string(), body);
    cancel.kind = "turn.cancel".into();
    h.publisher.publish(&cancel).await.unwrap();
    // Only admission runs until the cancel is recorded.
    let mut admit = h.spawn_child(&["worker", "validate"]);
    let pool = h.deps.store.pool().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let marked: Option<bool> = sqlx::query_scalar(
            "SELECT cancel_requested_at IS NOT NULL FROM turns WHERE session_id = $1::uuid AND turn_id = 't1'",
        )
        .bind(&s)
        .fetch_optional(&pool)
        .await
        .unwrap();
        if marked == Some(true) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cancel was never admitted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    terminate(&mut admit);

    let mut worker = h.spawn_child(&["run"]);
    let replies = h.replies(&s, 1, Duration::from_secs(90)).await;
    let finals: Vec<_> = replies.iter().filter(|r| r.is_final).collect();
    assert_eq!(finals.len(), 1, "{replies:?}");
    assert_eq!(finals[0].body["Errors"][0]["Code"], "turn.cancelled");
    assert!(replies.last().unwrap().is_final, "no delta after the reply");
    assert_eq!(h.sim.requests().len(), 1, "the provider was not called again");
    let records = h.records(&s).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["kind"], "cancelled");

    h.sim.set_latency(Latency::default());
    h.submit(&user_turn(&s, "t2", "and the session goes on")).await;
    let next = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(next.iter().filter(|r| r.is_final).count(), 1, "{next:?}");
    assert_eq!(next.last().unwrap().body["Successful"], true);
    let status = terminate(&mut worker);
    assert!(status.success(), "{status:?}");
    h.teardown().await;
}
