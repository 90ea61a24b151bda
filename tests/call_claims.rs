//! Invoke's claim on a provider call (migration 0037): copies of an invoke message that run at
//! the same time (a redelivery beside the original, an outbox row published again, a replayed
//! dead letter) call the provider once; a claim whose holder died is taken once its lease
//! lapses; a call that failed for now gives its claim up for the retry.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use aptix::broker::{OutMessage, StageName};
use aptix::sim::{Fault, Latency};
use common::{new_session, user_turn, Harness};
use lapin::options::BasicGetOptions;

const WAIT: Duration = Duration::from_secs(60);

/// Admits turn `t1` of a new session and drives it up to the invoke queue.
async fn up_to_invoke(h: &Harness) -> String {
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    for stage in ["validate", "retrieve", "assemble"] {
        assert!(h.drive(stage).await, "{stage}");
    }
    s
}

async fn claims(h: &Harness, s: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM llm_claims WHERE session_id = $1::uuid")
        .bind(s)
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_copies_of_an_invoke_message_running_at_once_call_the_provider_once() {
    let h = Harness::start(0).await;
    let s = up_to_invoke(&h).await;
    // The invoke message, twice in its queue: the original and a copy.
    let queue = h.topology.stage_queue(StageName::new("invoke"));
    let ch = h.conn.create_channel().await.unwrap();
    let got = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    for id in ["original", "copy"] {
        let body = got.delivery.data.clone();
        let msg = OutMessage::to_queue(queue.clone(), "turn", id.into(), body);
        h.publisher.publish(&msg).await.unwrap();
    }
    // Long enough a call that the copy starts while the original's is under way.
    h.sim.set_latency(Latency { fixed_ms: 1_500, ..Latency::default() });
    let (a, b) = tokio::join!(h.drive("invoke"), h.drive("invoke"));
    assert!(a && b, "both copies were taken");
    assert_eq!(h.sim.stats().requests, 1, "one provider call for both copies");
    assert_eq!(claims(&h, &s).await, 0, "the saved answer ended the claim");
    assert!(h.drive("persist").await && h.drive("persist").await);
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(replies.last().unwrap().body["Successful"], true);
    assert_eq!(h.records(&s).await.len(), 1);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_holder_died_is_taken_once_its_lease_lapses() {
    let h = Harness::start(0).await;
    let s = up_to_invoke(&h).await;
    // A holder that claimed the call and died: its lease has a second and a half to run.
    sqlx::query(
        "INSERT INTO llm_claims (session_id, turn_id, step, attempt, until)
         VALUES ($1::uuid, 't1', 0, gen_random_uuid(), clock_timestamp() + interval '1.5 s')",
    )
    .bind(&s)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
    let started = Instant::now();
    assert!(h.drive("invoke").await);
    assert!(started.elapsed() >= Duration::from_millis(1_400), "waited for the lease");
    assert_eq!(h.sim.stats().requests, 1, "then called, once");
    assert!(h.drive("persist").await);
    assert_eq!(h.replies(&s, 1, WAIT).await.last().unwrap().body["Successful"], true);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_that_failed_for_now_gives_up_its_claim_for_the_retry() {
    let h = Harness::start_with(0, |s| s.llm.max_retries = 0).await;
    let s = up_to_invoke(&h).await;
    h.sim.faults().fail_next(Fault::Status { status: 503 }, 1);
    assert!(h.drive("invoke").await);
    assert_eq!(h.sim.stats().requests, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while claims(&h, &s).await > 0 {
        assert!(Instant::now() < deadline, "the failed call's claim was never given up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.teardown().await;
}
