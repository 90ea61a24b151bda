//! Partitioned stage queues (`amqp.stage_partitions`) when the setting changes under a running
//! pipeline, the documented way: workers of the new setting, told the old value in
//! `amqp.draining_stage_partitions`, consume what workers of the old one left in its partitions,
//! and the turn completes; `aptix status` counts the old layout too.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aptix::broker::StageName;
use common::{new_session, user_turn, Harness};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_left_in_an_earlier_layout_is_drained_by_the_new_one() {
    let mut h = Harness::start_with(0, |s| {
        s.amqp.stage_partitions = 4;
        s.amqp.draining_stage_partitions = vec![2];
    })
    .await;
    // Workers of the old setting (2 partitions) admit and retrieve, then stop: the turn waits
    // in a partition of the old layout of assemble, which no stage of the new setting names.
    let mut old = (*h.deps).clone();
    old.topology = old.topology.clone().with_stage_partitions(2).draining_stage_partitions(&[]);
    let stop_old = CancellationToken::new();
    let first = [StageName::new("validate"), StageName::new("retrieve")];
    let running = {
        let (old, stop) = (Arc::new(old.clone()), stop_old.clone());
        tokio::spawn(async move { aptix::pipeline::run(old, &first, 1, stop).await })
    };
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "left behind by a rollout")).await;
    let assemble = StageName::new("assemble");
    let old_partitions = old.topology.clone().with_stages(&aptix::stages::names());
    let old_partitions = old_partitions.stage_partition_queues(assemble);
    assert_eq!(old_partitions.len(), 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut waiting = 0;
        for q in &old_partitions {
            waiting += h.peek_count(q).await;
        }
        if waiting == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the turn never reached {old_partitions:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_old.cancel();
    running.await.unwrap();
    // Its vector store is the harness's: let go of it before the teardown removes its files.
    drop(old);

    // The status lists the old layout beside the new one, with the message waiting.
    let states = h.topology.queue_states(&h.publisher, &[]).await.unwrap();
    let old_state: u32 =
        states.iter().filter(|q| old_partitions.contains(&q.queue)).map(|q| q.ready).sum();
    assert_eq!(old_state, 1, "{states:?}");
    assert!(states.iter().any(|q| q.queue.ends_with(".assemble.p4.3")), "{states:?}");

    // The new setting's workers: the turn completes, once.
    h.run(1);
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(replies.last().unwrap().body["Successful"], true, "{replies:?}");
    assert_eq!(h.records(&s).await.len(), 1);
    for q in &old_partitions {
        assert_eq!(h.peek_count(q).await, 0, "{q} drained");
    }
    h.teardown().await;
}
