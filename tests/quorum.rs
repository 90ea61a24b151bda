//! `amqp.queue_type = "quorum"` on the service node: the pipeline's own queues are quorum queues
//! with the arguments the pipeline relies on, session reply queues stay classic, and turns flow
//! through partitioned ingress and partitioned stage queues, retries through the TTL delay
//! queues (back to the stage's single queue) and dead-lettering.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use aptix::config::QueueType;
use common::{new_session, user_turn, Harness};

/// `name → (type, arguments)` of the queues whose name starts with `prefix.`, from rabbitmqctl.
fn queues(prefix: &str) -> HashMap<String, (String, String)> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_queues", "--no-table-headers", "name", "type", "arguments"])
        .output()
        .expect("rabbitmqctl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut cols = line.splitn(3, '\t');
            let (name, kind, args) = (cols.next()?, cols.next()?, cols.next().unwrap_or(""));
            name.starts_with(&format!("{prefix}."))
                .then(|| (name.to_owned(), (kind.to_owned(), args.to_owned())))
        })
        .collect()
}

fn setup_broker() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rabbitmq/setup.sh");
    let status = std::process::Command::new("bash").arg(script).arg("--dev").status().unwrap();
    assert!(status.success(), "deploy/rabbitmq/setup.sh failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_queues_carry_turns_retries_and_dead_letters() {
    setup_broker();
    let h = Harness::start_with(1, |s| {
        s.amqp.queue_type = QueueType::Quorum;
        s.amqp.ingress_partitions = 4;
        s.amqp.stage_partitions = 2;
        s.llm.max_retries = 0;
        s.pipeline.max_attempts.set("invoke", 2);
    })
    .await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "hello over quorum queues")).await;
    let first = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(first.iter().filter(|r| r.is_final).count(), 1, "{first:?}");
    assert_eq!(first.last().unwrap().body["Successful"], true);

    // One failed LLM call: invoke retries through the 500 ms delay queue (TTL, then
    // dead-lettered back at least once) and the turn succeeds.
    h.sim.faults().fail_next(aptix::sim::Fault::ServerError, 1);
    h.submit(&user_turn(&s, "t2", "once more")).await;
    let second = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(second.last().unwrap().body["Successful"], true, "{second:?}");

    // The LLM stays down: attempts run out, the turn fails, the message is dead-lettered.
    h.sim.faults().fail_randomly(aptix::sim::Fault::ServerError, 1.0);
    h.submit(&user_turn(&s, "t3", "down")).await;
    let third = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(third.last().unwrap().body["Successful"], false, "{third:?}");
    h.sim.faults().clear();
    assert_eq!(h.dead_letters().await.len(), 1);
    assert_eq!(h.records(&s).await.len(), 3);

    let listed = queues(h.topology.prefix());
    let kind = |q: &str| listed.get(q).map(|(k, _)| k.as_str()).unwrap_or("missing").to_owned();
    for q in h.topology.ingress_queues() {
        assert_eq!(kind(&q), "quorum", "{q}");
        let args = &listed[&q].1;
        assert!(args.contains("x-single-active-consumer"), "{q}: {args}");
        assert!(args.contains("at-least-once") && args.contains("reject-publish"), "{args}");
        assert!(args.contains("x-delivery-limit"), "{q}: {args}");
    }
    for stage in aptix::stages::names().into_iter().skip(1) {
        let queues = h.topology.consumed_queues(stage);
        assert_eq!(queues.len(), 3, "the single queue and 2 partitions: {queues:?}");
        for q in &queues {
            assert_eq!(kind(q), "quorum", "{q}");
            assert!(listed[q].1.contains("x-delivery-limit"), "{q}: {:?}", listed[q]);
        }
        // Partitions are led from all of a cluster's nodes, not the declaring worker's alone.
        for q in &queues[1..] {
            assert!(listed[q].1.contains("balanced"), "{q}: {:?}", listed[q]);
        }
    }
    for tier in aptix::broker::RETRY_TIERS_MS {
        let q = h.topology.delay_exchange(tier);
        assert_eq!(kind(&q), "quorum", "{q}");
        assert!(listed[&q].1.contains("x-message-ttl"), "{q}: {:?}", listed[&q]);
    }
    assert_eq!(kind(&h.topology.dead()), "quorum");
    let session = h.topology.session_queue(&s.parse().unwrap());
    assert_eq!(kind(&session), "classic", "reply queues stay classic");
    h.teardown().await;
}
