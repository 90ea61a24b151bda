//! Invoke's claim on a provider call (migration 0037): copies of an invoke message that run at
//! the same time (a redelivery beside the original, an outbox row published again, a replayed
//! dead letter) call the provider once; a claim whose holder's process died is taken at once,
//! one whose holder is alive once its lease lapses; a call that failed for now gives its claim
//! up for the retry; a holder whose claim was taken stops its call and waits as a copy.
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

/// Claims `s`'s call for another attempt of process `holder` (its liveness key; `None`: not
/// known), until `lease` from now.
async fn claimed_elsewhere(h: &Harness, s: &str, holder: Option<i64>, lease: &str) {
    sqlx::query(
        "INSERT INTO llm_claims (session_id, turn_id, step, attempt, until, holder)
         VALUES ($1::uuid, 't1', 0, gen_random_uuid(), clock_timestamp() + $2::interval, $3)",
    )
    .bind(s)
    .bind(lease)
    .bind(holder)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_holder_is_alive_holds_until_its_lease_lapses() {
    let h = Harness::start(0).await;
    let s = up_to_invoke(&h).await;
    // A holder alive but stuck: its process holds its liveness lock (here, a connection of the
    // test's), and its lease has a second and a half to run.
    let mut alive = h.deps.store.pool().acquire().await.unwrap().detach();
    let key: i64 = 0x5eed_0000_0000_0001;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(key).execute(&mut alive).await.unwrap();
    claimed_elsewhere(&h, &s, Some(key), "1.5 s").await;
    let started = Instant::now();
    assert!(h.drive("invoke").await);
    assert!(started.elapsed() >= Duration::from_millis(1_400), "waited for the lease");
    assert_eq!(h.sim.stats().requests, 1, "then called, once");
    assert!(h.drive("persist").await);
    assert_eq!(h.replies(&s, 1, WAIT).await.last().unwrap().body["Successful"], true);
    drop(alive);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_holders_process_died_is_taken_at_once() {
    let h = Harness::start(0).await;
    let s = up_to_invoke(&h).await;
    // A holder SIGKILLed mid-call: it missed its renewal (15 s of its 30 s lease left), and its
    // liveness lock went with its connection (nobody holds this key).
    claimed_elsewhere(&h, &s, Some(0x5eed_0000_0000_0002), "15 s").await;
    let started = Instant::now();
    assert!(h.drive("invoke").await);
    assert!(started.elapsed() < Duration::from_secs(10), "took the call without the lease");
    assert_eq!(h.sim.stats().requests, 1);
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

/// A holder whose claim a copy took (its lease lapsed unrenewed, here taken by hand) stops its
/// call at its next renewal and waits as a copy; the copy, which here never answers, lets its
/// lease lapse, and the holder takes the call again: the round trip still ends once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_claim_was_taken_stops_its_call_and_waits_as_a_copy() {
    let h = Harness::start(0).await;
    let s = up_to_invoke(&h).await;
    h.sim.set_latency(Latency { fixed_ms: 60_000, ..Latency::default() });
    let started = Instant::now();
    let steal = async {
        // Once the first call is claimed, the "copy" takes the claim for 15 s: past the
        // holder's first renewal, 10 s after its claim.
        while claims(&h, &s).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sqlx::query(
            "UPDATE llm_claims SET attempt = gen_random_uuid(),
                    until = clock_timestamp() + interval '15 s'
             WHERE session_id = $1::uuid",
        )
        .bind(&s)
        .execute(h.deps.store.pool())
        .await
        .unwrap();
        // Only once the first call reached the simulator: later calls answer at once.
        while h.sim.stats().requests == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // It is counted as it arrives and reads its latency a moment later.
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.sim.set_latency(Latency::default());
    };
    let (driven, ()) = tokio::join!(h.drive("invoke"), steal);
    assert!(driven);
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(14), "waited for the taken lease: {took:?}");
    assert!(took < Duration::from_secs(45), "the first call was stopped: {took:?}");
    assert_eq!(h.sim.stats().requests, 2, "stopped at the renewal, called again after the lapse");
    assert!(h.drive("persist").await);
    assert_eq!(h.replies(&s, 1, WAIT).await.last().unwrap().body["Successful"], true);
    assert_eq!(h.records(&s).await.len(), 1);
    h.teardown().await;
}
