//! The runtime's shared ack frames against the real broker: deliveries settled together are
//! acked in one frame, and a multiple ack never takes a delivery that is not settled, still
//! running or not yet taken from its consumer (the broker gives exactly those back when the
//! channel closes).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aptix::broker::{connect, AckBatch};
use futures_util::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A queue of its own holding messages "0".."n-1", and a consumer of it.
async fn queue_of(conn: &Connection, n: usize) -> (String, lapin::Consumer) {
    let queue = format!("acks-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();
    for i in 0..n {
        let body = i.to_string().into_bytes();
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default(),
        )
        .await
        .unwrap();
    }
    let consumer = consume(conn, &queue).await;
    (queue, consumer)
}

async fn consume(conn: &Connection, queue: &str) -> lapin::Consumer {
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(100, BasicQosOptions::default()).await.unwrap();
    let opts = BasicConsumeOptions::default();
    ch.basic_consume(queue.into(), "".into(), opts, FieldTable::default()).await.unwrap()
}

async fn take(consumer: &mut lapin::Consumer, n: usize) -> Vec<Delivery> {
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(5), consumer.next()).await;
        got.push(next.expect("a delivery within 5 s").unwrap().unwrap());
    }
    got
}

/// The bodies the broker gives back, read on a new connection, which then deletes the queue.
/// Called after the consumer's connection is closed, which gives its unacked messages back.
async fn given_back(consumer: lapin::Consumer, queue: &str) -> Vec<String> {
    drop(consumer);
    let fresh = connect(AMQP).await.unwrap();
    let mut again = consume(&fresh, queue).await;
    let mut bodies = Vec::new();
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(500), again.next()).await
    {
        bodies.push(String::from_utf8(d.data).unwrap());
    }
    let ch = fresh.create_channel().await.unwrap();
    ch.queue_delete(queue.into(), QueueDeleteOptions::default()).await.unwrap();
    bodies.sort();
    bodies
}

async fn ack_together(acks: &AckBatch, deliveries: &[&Delivery]) {
    let all = deliveries.iter().map(|d| acks.ack(d.delivery_tag, &d.acker));
    for sent in futures_util::future::join_all(all).await {
        sent.unwrap();
    }
}

// One thread, as a pipeline process runs by default: the acks settled while the test's task
// runs are all waiting when the sending task gets its turn.
#[tokio::test]
async fn deliveries_settled_together_are_acked_in_one_frame() {
    let conn = connect(AMQP).await.unwrap();
    let (queue, mut consumer) = queue_of(&conn, 6).await;
    let (acks, sending) = AckBatch::new();
    tokio::spawn(sending);
    let got = take(&mut consumer, 6).await;
    got.iter().for_each(|d| acks.taken(d.delivery_tag));
    ack_together(&acks, &got.iter().collect::<Vec<_>>()).await;
    assert_eq!(acks.frames(), 1, "six deliveries settled together");
    conn.close(200, "done".into()).await.unwrap();
    assert!(given_back(consumer, &queue).await.is_empty());
}

// One thread, as a pipeline process runs by default: the acks settled while the test's task
// runs are all waiting when the sending task gets its turn.
#[tokio::test]
async fn a_multiple_ack_never_takes_an_unsettled_or_untaken_delivery() {
    let conn = connect(AMQP).await.unwrap();
    let (queue, mut consumer) = queue_of(&conn, 8).await;
    let (acks, sending) = AckBatch::new();
    tokio::spawn(sending);
    let got = take(&mut consumer, 8).await;
    // "5" has not been taken from its consumer (another consumer's stream of the channel,
    // merged later); "7" was settled by a nack, already sent.
    for (i, d) in got.iter().enumerate() {
        if i != 5 {
            acks.taken(d.delivery_tag);
        }
    }
    acks.settled_otherwise(got[7].delivery_tag);
    // "3" still running: 0-2 share a frame, 4 goes alone.
    ack_together(&acks, &[&got[0], &got[1], &got[2], &got[4]]).await;
    assert_eq!(acks.frames(), 2);
    // "5" not taken: 3 and 6 go alone.
    ack_together(&acks, &[&got[3], &got[6]]).await;
    assert_eq!(acks.frames(), 4);
    conn.close(200, "done".into()).await.unwrap();
    assert_eq!(given_back(consumer, &queue).await, ["5", "7"]);
}
