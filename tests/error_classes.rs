//! One test per error class (docs/architecture.md, "Errors keep their class"): what happens to
//! the message and to the turn when a dependency is down, when the turn cannot succeed, when
//! stored data is corrupt, and when a step is offered for a turn that is not running it.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::broker::{process_one, StageName};
use aptix::sim::Fault;
use common::{new_session, user_turn, Harness};
use lapin::options::BasicGetOptions;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

async fn drive(h: &Harness, deps: &aptix::stages::Deps, stage: &'static str) -> bool {
    let stage = StageName::new(stage);
    let handler = aptix::pipeline::handler(deps, stage).unwrap();
    let settings = aptix::pipeline::runtime_settings(&h.settings, stage);
    process_one(stage, &*handler, &h.conn, &h.publisher, &settings).await.unwrap()
}

async fn reason_of_dead_letters(h: &Harness) -> Vec<String> {
    h.dead_letters()
        .await
        .into_iter()
        .map(|(headers, _)| headers["x-aptix-reason"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_a_provider_outage_is_retried_through_the_delay_queue_and_the_turn_completes() {
    let h = Harness::start_with(1, |s| {
        s.llm.max_retries = 0;
        s.pipeline.max_attempts.set("invoke", 3);
    })
    .await;
    h.sim.faults().fail_next(Fault::Status { status: 503 }, 2);
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(
        replies.last().unwrap().body["Successful"],
        true,
        "{:?}",
        replies.last().unwrap().body
    );
    assert_eq!(h.sim.stats().requests, 3, "two failed calls, then the one that answered");
    assert!(h.dead_letters().await.is_empty());
    assert_eq!(h.records(&s).await.len(), 1);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_a_turn_that_cannot_succeed_ends_with_its_error_one_record_and_no_dead_letter() {
    // The conversation context a turn was admitted with is gone when retrieve runs (a rolling
    // restart removed it from the configuration).
    let h = Harness::start_with(0, |s| {
        let ctx = s.conversation_contexts[&s.default_conversation_context].clone();
        s.conversation_contexts.insert("temp".into(), ctx);
    })
    .await;
    let s = new_session();
    let mut turn = user_turn(&s, "t1", "hello");
    turn["ConversationContextId"] = json!("temp");
    h.submit(&turn).await;
    assert!(drive(&h, &h.deps, "validate").await);
    let mut settings = (*h.settings).clone();
    settings.conversation_contexts.remove("temp");
    let restarted = aptix::pipeline::build_deps(std::sync::Arc::new(settings), None).await.unwrap();
    assert!(drive(&h, &restarted, "retrieve").await);
    assert!(drive(&h, &restarted, "persist").await, "the failed round trip goes to the last stage");
    let reply = &h.replies(&s, 1, WAIT).await.last().unwrap().body.clone();
    assert_eq!(reply["Successful"], false, "{reply}");
    assert_eq!(reply["Errors"][0]["Code"], "context.unknown_conversation_context", "{reply}");
    assert_eq!(h.records(&s).await[0]["kind"], "error");
    assert!(h.dead_letters().await.is_empty(), "a failed turn is an answer, not a dead letter");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permanent_corrupt_session_state_dead_letters_now_and_fails_the_turn() {
    let h = Harness::start(1).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    assert_eq!(h.replies(&s, 1, WAIT).await.last().unwrap().body["Successful"], true);
    sqlx::query("UPDATE sessions SET state = '{\"chain\": 5}' WHERE id = $1::uuid")
        .bind(&s)
        .execute(h.deps.store.pool())
        .await
        .unwrap();
    h.submit(&user_turn(&s, "t2", "again")).await;
    let reply = h.replies(&s, 1, WAIT).await.last().unwrap().body.clone();
    assert_eq!(reply["Errors"][0]["Code"], "internal.error", "{reply}");
    let reasons = reason_of_dead_letters(&h).await;
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("unusable data"), "{reasons:?}");
    assert_eq!(h.sim.stats().requests, 1, "the corrupt turn never reached the provider");
    let kinds: Vec<Value> = h.records(&s).await.iter().map(|r| r["kind"].clone()).collect();
    assert_eq!(kinds, [json!("final"), json!("error")]);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permanent_an_unreadable_saved_answer_is_never_taken_for_no_answer() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    for stage in ["validate", "retrieve", "assemble"] {
        assert!(drive(&h, &h.deps, stage).await, "{stage}");
    }
    // A saved answer this version cannot read: calling the provider again could charge twice.
    sqlx::query("INSERT INTO llm_results (session_id, turn_id, step, result) VALUES ($1::uuid, 't1', 0, $2)")
        .bind(&s)
        .bind(json!({"v": 9, "job": {}}))
        .execute(h.deps.store.pool())
        .await
        .unwrap();
    assert!(drive(&h, &h.deps, "invoke").await);
    assert!(drive(&h, &h.deps, "persist").await);
    assert_eq!(h.sim.stats().requests, 0, "no second provider call");
    let reply = h.replies(&s, 1, WAIT).await.last().unwrap().body.clone();
    assert_eq!(reply["Errors"][0]["Code"], "internal.error", "{reply}");
    assert_eq!(reason_of_dead_letters(&h).await.len(), 1);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_a_step_for_a_turn_that_is_not_running_it_is_dead_lettered_and_changes_nothing() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    for stage in ["validate", "retrieve", "assemble", "invoke"] {
        assert!(drive(&h, &h.deps, stage).await, "{stage}");
    }
    // Copy the persist message, finish the turn, then offer the copy again.
    let ch = h.conn.create_channel().await.unwrap();
    let queue = h.topology.stage_queue(StageName::new("persist"));
    let got = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    let body = got.delivery.data.clone();
    let real =
        aptix::broker::OutMessage::to_queue(queue.clone(), "turn", "real".into(), body.clone());
    h.publisher.publish(&real).await.unwrap();
    assert!(drive(&h, &h.deps, "persist").await);
    let mut forged: Value = serde_json::from_slice(&body).unwrap();
    forged["job"]["step"] = json!(7);
    let msg = aptix::broker::OutMessage::to_queue(
        queue,
        "turn",
        "forged".into(),
        serde_json::to_vec(&forged).unwrap(),
    );
    h.publisher.publish(&msg).await.unwrap();
    assert!(drive(&h, &h.deps, "persist").await);
    let reasons = reason_of_dead_letters(&h).await;
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("not running step 7"), "{reasons:?}");
    assert_eq!(h.replies(&s, 1, WAIT).await.len(), 1, "one reply: the turn's own");
    assert_eq!(h.records(&s).await.len(), 1);
    h.teardown().await;
}
