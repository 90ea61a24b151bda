//! Messages that can never be handled end their turn with a record and a reply instead of
//! wedging the pipeline: an output larger than the broker accepts, an admitted turn whose ingress
//! message is given up, and a persist step offered for a turn that is not running at that step.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::broker::{process_one, Delivery, OutMessage, StageName};
use common::{new_session, user_turn, Harness};
use lapin::options::BasicGetOptions;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

async fn drive(h: &Harness, stage: StageName) -> bool {
    let handler = aptix::pipeline::handler(&h.deps, stage).unwrap();
    let settings = aptix::pipeline::runtime_settings(&h.settings, stage);
    process_one(stage, &*handler, &h.conn, &h.publisher, &settings).await.unwrap()
}

async fn turn_state(h: &Harness, session: &str, turn: &str) -> String {
    sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1::uuid AND turn_id = $2")
        .bind(session)
        .bind(turn)
        .fetch_one(h.deps.store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_output_larger_than_the_broker_accepts_fails_the_turn_and_the_pipeline_goes_on() {
    // The invoke message carries the request and the body built from it: about twice the
    // instruction, over this limit, while the ingress and retrieve messages fit under it.
    let h = Harness::start_with(1, |s| s.amqp.max_message_bytes = 40_000).await;
    let s = new_session();
    h.submit(&user_turn(&s, "big", &"x".repeat(25_000))).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let reply = &replies.last().expect("a reply").body;
    assert_eq!(reply["Successful"], false, "{reply}");
    assert_eq!(reply["Errors"][0]["Code"], "internal.undeliverable", "{reply}");
    let dead = h.dead_letters().await;
    assert!(dead.iter().any(|(h, _)| h["x-aptix-reason"].contains("undeliverable")), "{dead:?}");
    assert_eq!(h.records(&s).await.len(), 1, "one record of the failed turn");
    // The next turn of the session runs, on the same workers, at once.
    h.submit(&user_turn(&s, "small", "hello")).await;
    let next = h.replies(&s, 1, WAIT).await;
    assert_eq!(next.last().unwrap().body["Successful"], true, "{next:?}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admitted_turn_whose_ingress_message_is_given_up_fails_and_frees_the_session() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "first")).await;
    h.submit(&user_turn(&s, "t2", "second")).await;
    // Admit t1 and keep a copy of its ingress message; t2 queues behind it.
    let ch = h.conn.create_channel().await.unwrap();
    let requests = h.topology.requests();
    let got =
        ch.basic_get(requests.as_str().into(), BasicGetOptions::default()).await.unwrap().unwrap();
    let body = got.delivery.data.clone();
    let message_id = got.delivery.properties.message_id().as_ref().map(|m| m.to_string());
    got.delivery
        .nack(lapin::options::BasicNackOptions { requeue: true, ..Default::default() })
        .await
        .unwrap();
    assert!(
        drive(&h, StageName::new("validate")).await && drive(&h, StageName::new("validate")).await
    );
    assert_eq!(turn_state(&h, &s, "t1").await, "running");
    assert_eq!(turn_state(&h, &s, "t2").await, "queued");
    // The runtime gives the message up (it killed its consumers too often).
    let handler = aptix::pipeline::handler(&h.deps, StageName::new("validate")).unwrap();
    let delivery = Delivery {
        body: body.into(),
        headers: Default::default(),
        message_id,
        reply_to: None,
        user_id: None,
        kind: None,
        redelivered: true,
        attempt: 0,
        hint: Default::default(),
    };
    let messages = handler.exhausted(delivery, "poison: test".into()).await;
    assert_eq!(turn_state(&h, &s, "t1").await, "failed");
    assert_eq!(turn_state(&h, &s, "t2").await, "running", "the session's next turn starts");
    let records = h.records(&s).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["kind"], "error");
    let reply = messages.iter().find(|m| m.kind == "reply").expect("a reply for t1");
    let body: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["Errors"][0]["Code"], "internal.retries_exhausted");
    assert!(!body.to_string().contains("poison"), "the reason stays in the logs: {body}");
    assert!(messages
        .iter()
        .any(|m| m.routing_key == h.topology.stage_queue(StageName::new("retrieve"))));
    // The embedded vector store flushes when its last user lets go: before its directory goes.
    drop(handler);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_persist_step_for_a_turn_that_is_not_running_is_dead_lettered_and_writes_nothing() {
    let h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    for stage in [
        StageName::new("validate"),
        StageName::new("retrieve"),
        StageName::new("assemble"),
        StageName::new("invoke"),
    ] {
        assert!(drive(&h, stage).await, "{stage:?} had nothing to do");
    }
    let ch = h.conn.create_channel().await.unwrap();
    let persist = h.topology.stage_queue(StageName::new("persist"));
    let got = ch
        .basic_get(persist.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap();
    let mut forged: Value = serde_json::from_slice(&got.delivery.data).unwrap();
    // The genuine step, then the same message for a turn that never ran.
    h.publisher
        .publish(&OutMessage::to_queue(
            persist.clone(),
            "turn",
            "real".into(),
            got.delivery.data.clone(),
        ))
        .await
        .unwrap();
    assert!(drive(&h, StageName::new("persist")).await);
    forged["job"]["key"]["turn_id"] = "never-admitted".into();
    let body = serde_json::to_vec(&forged).unwrap();
    h.publisher
        .publish(&OutMessage::to_queue(persist, "turn", "forged".into(), body))
        .await
        .unwrap();
    assert!(drive(&h, StageName::new("persist")).await);
    let records = h.records(&s).await;
    assert_eq!(records.len(), 1, "only the genuine step was recorded");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].0["x-aptix-reason"].contains("not running"), "{:?}", dead[0].0);
    let replies = h.replies(&s, 2, Duration::from_secs(3)).await;
    assert_eq!(replies.len(), 1, "no reply for the forged step: {replies:?}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_at_the_documented_maximum_flows_through_every_hop_within_16_mib() {
    // The guard is RabbitMQ 4's default limit, whatever the local broker allows.
    let h = Harness::start_with(1, |s| s.amqp.max_message_bytes = 16 * 1024 * 1024).await;
    let limits = &h.settings.limits;
    let s = new_session();
    // Active files just under the size that is still sent to the model, so the assembled body
    // carries them all again: the invoke and persist messages hold the request about twice.
    let each = usize::try_from(h.settings.assemble.active_file_max_bytes).unwrap() - 1_000;
    let count = (limits.max_request_bytes - 10_000) / (each + 200);
    let artifacts: Vec<Value> = (0..count)
        .map(|i| {
            serde_json::json!({"RelativePath": format!("src/f{i}.rs"), "FileName": format!("f{i}.rs"),
                "Contents": "y".repeat(each), "Origin": "ide"})
        })
        .collect();
    let request = serde_json::json!({"SessionId": s, "TurnId": "max", "Instruction": "read them all",
        "InputArtifacts": artifacts});
    let size = serde_json::to_vec(&request).unwrap().len();
    assert!(size <= limits.max_request_bytes && size > limits.max_request_bytes * 9 / 10, "{size}");
    h.submit(&request).await;
    let replies = h.replies(&s, 1, WAIT).await;
    let reply = &replies.last().expect("a reply").body;
    assert_eq!(
        reply["Successful"],
        true,
        "{}",
        &reply.to_string()[..reply.to_string().len().min(2000)]
    );
    assert!(h.dead_letters().await.is_empty());
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupt_stored_state_at_persist_is_dead_lettered_now_and_the_turn_fails() {
    // The state persist builds on is the one its message carries, or, in a message queued by an
    // earlier build (none carried), the session's row: either may be unreadable.
    for carried in [true, false] {
        let h = Harness::start(0).await;
        let s = new_session();
        h.submit(&user_turn(&s, "t1", "hello")).await;
        for stage in ["validate", "retrieve", "assemble", "invoke"] {
            assert!(drive(&h, StageName::new(stage)).await, "{stage} had nothing to do");
        }
        let queue = h.topology.stage_queue(StageName::new("persist"));
        let ch = h.conn.create_channel().await.unwrap();
        let got = ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true });
        let got = got.await.unwrap().expect("the persist message");
        let mut persist: Value = serde_json::from_slice(&got.delivery.data).unwrap();
        let message = persist.as_object_mut().unwrap();
        let not_a_state = serde_json::json!(["not a state"]);
        if carried {
            message.insert("session_state".into(), not_a_state);
        } else {
            message.remove("session_state").expect("a carried state");
            // The session's state became unreadable between assembly and persist.
            sqlx::query("UPDATE sessions SET state = $2 WHERE id = $1::uuid")
                .bind(&s)
                .bind(&not_a_state)
                .execute(h.deps.store.pool())
                .await
                .unwrap();
        }
        let body = serde_json::to_vec(&persist).unwrap();
        h.publisher.publish(&OutMessage::to_queue(queue, "turn", "t1".into(), body)).await.unwrap();
        assert!(drive(&h, StageName::new("persist")).await);
        let dead = h.dead_letters().await;
        assert_eq!(
            dead.len(),
            1,
            "carried {carried}: dead-lettered at once, not retried: {dead:?}"
        );
        assert!(dead[0].0["x-aptix-reason"].contains("unusable data"), "{:?}", dead[0].0);
        // Its failed-turn message is next: the turn ends with a record and a reply.
        assert!(drive(&h, StageName::new("persist")).await);
        assert_eq!(turn_state(&h, &s, "t1").await, "failed");
        let replies = h.replies(&s, 1, WAIT).await;
        let reply = &replies.last().expect("a reply").body;
        assert_eq!(reply["Errors"][0]["Code"], "internal.error", "{reply}");
        assert!(!reply.to_string().contains("not a state"), "details stay in the logs: {reply}");
        h.teardown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_message_without_the_pipelines_mac_is_dead_lettered_before_its_stage_runs() {
    let mut h = Harness::start(0).await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello")).await;
    // Driven alone (no keys), validate hands on an unsigned retrieve message: its body is a
    // genuine stage message, the shape a forger would copy.
    assert!(drive(&h, StageName::new("validate")).await);
    let retrieve = h.topology.stage_queue(StageName::new("retrieve"));
    let ch = h.conn.create_channel().await.unwrap();
    let got = ch.basic_get(retrieve.as_str().into(), BasicGetOptions { no_ack: true });
    let body = got.await.unwrap().expect("the retrieve message").delivery.data.clone();
    let to_retrieve =
        |id: &str| OutMessage::to_queue(retrieve.clone(), "turn", id.into(), body.clone());
    let keys = aptix::pipeline::runtime_settings(&h.deps.settings, StageName::new("retrieve"))
        .keys
        .expect("every pipeline process has a message key");
    let other = aptix::broker::MessageKeys::new(vec![b"not the pipeline's key".to_vec()]).unwrap();
    let mac = aptix::broker::MAC_HEADER;
    h.publisher.publish(&to_retrieve("unsigned")).await.unwrap();
    let fields = aptix::broker::stage_mac_fields("turn", &retrieve);
    let wrong = to_retrieve("wrong-key").header(mac, other.sign(&fields, &body));
    h.publisher.publish(&wrong).await.unwrap();
    h.run(1);
    let mut reasons = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while reasons.len() < 2 && tokio::time::Instant::now() < deadline {
        for (headers, _) in h.dead_letters().await {
            reasons.push((headers["x-aptix-stage"].clone(), headers["x-aptix-reason"].clone()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for (stage, reason) in &reasons {
        assert_eq!(stage, "retrieve");
        assert!(reason.starts_with("unauthenticated"), "{reason}");
    }
    assert_eq!(h.sim.stats().requests, 0, "no forged message reached the model");
    assert_eq!(turn_state(&h, &s, "t1").await, "running", "nothing moved the turn");
    // The same body under the pipeline's key is the pipeline's own.
    let genuine = to_retrieve("genuine").header(mac, keys.sign(&fields, &body));
    h.publisher.publish(&genuine).await.unwrap();
    let replies = h.replies(&s, 1, WAIT).await;
    assert_eq!(replies.last().unwrap().body["Successful"], true);
    h.teardown().await;
}

/// A request that names no session is not ordered: when a consumer dies on it, the ingress
/// publishes it again with its redelivery count, under the pipeline's MAC (the ingress drops a
/// client's own counts). The count survives each round, so a crash loop ends as poison after
/// `max_redeliveries` even on a classic ingress, which has no delivery limit of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessionless_request_a_consumer_keeps_dying_on_ends_as_poison() {
    let h = Harness::start(0).await;
    let request = h.topology.request("-", "no-session".into(), br#"{"TurnId":"x"}"#.to_vec());
    h.publisher.publish(&request).await.unwrap();
    let ingress = h.topology.ingress_queues()[0].clone();
    let validate = StageName::new("validate");
    // As a pipeline process runs it: with the message key (`drive` runs without one).
    let settings = aptix::pipeline::runtime_settings(&h.deps.settings, validate);
    assert!(settings.keys.is_some());
    let handler = aptix::pipeline::handler(&h.deps, validate).unwrap();
    let limit = settings.max_redeliveries;
    for round in 0..=limit {
        // A consumer takes it and dies before acknowledging: the broker delivers it again.
        let ch = h.conn.create_channel().await.unwrap();
        let got = ch.basic_get(ingress.as_str().into(), BasicGetOptions::default()).await.unwrap();
        assert!(got.is_some(), "round {round}: the request is not in the ingress queue");
        ch.close(200, "died".into()).await.unwrap();
        let handled = process_one(validate, &*handler, &h.conn, &h.publisher, &settings).await;
        assert!(handled.unwrap(), "round {round}");
    }
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let died = format!("poison: delivered to a consumer that died {} times", limit + 1);
    assert_eq!(dead[0].0["x-aptix-reason"], died, "{:?}", dead[0].0);
    assert!(h.take_all(&ingress).await.is_empty(), "nothing left to loop");
    h.teardown().await;
}
