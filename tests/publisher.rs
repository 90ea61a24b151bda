//! The confirmed publisher against the real broker: a returned (unroutable) publish is charged
//! to its own message even among many concurrent ones, a channel the broker closed is replaced,
//! and a message over the size limit is refused before it is sent.
#![allow(clippy::unwrap_used)]

use aptix::broker::{connect, BrokerError, OutMessage, Publisher};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn prefix() -> String {
    format!("pub-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_mandatory_publishes_get_their_own_returns() {
    let conn = connect(AMQP).await.unwrap();
    let publisher = Publisher::connect(AMQP).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let p = prefix();
    let (routable, missing) = (format!("{p}.here"), format!("{p}.nowhere"));
    ch.queue_declare(
        routable.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for round in 0..5 {
        // Interleaved: every third message goes to a queue that does not exist.
        let messages: Vec<(bool, OutMessage)> = (0..300)
            .map(|i| {
                let lost = i % 3 == 0;
                let queue = if lost { missing.clone() } else { routable.clone() };
                (
                    lost,
                    OutMessage::to_queue(queue, "turn", format!("m-{round}-{i}"), vec![b'x'; 64]),
                )
            })
            .collect();
        let results =
            futures_util::future::join_all(messages.iter().map(|(_, m)| publisher.publish(m)))
                .await;
        for ((lost, m), result) in messages.iter().zip(results) {
            match (lost, result) {
                (true, Err(BrokerError::Unroutable { routing_key, .. })) => {
                    assert_eq!(routing_key, m.routing_key)
                }
                (false, Ok(())) => {}
                (lost, other) => panic!("{} (unroutable: {lost}) got {other:?}", m.message_id),
            }
        }
    }
    let count = ch
        .queue_declare(
            routable.as_str().into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count();
    assert_eq!(count, 5 * 200, "every routable message arrived once");
    ch.queue_delete(routable.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closed_by_the_broker_is_replaced() {
    let conn = connect(AMQP).await.unwrap();
    let publisher = Publisher::connect(AMQP).await.unwrap();
    let p = prefix();
    // Publishing to an exchange that does not exist makes the broker close the channel (404).
    let mut bad = OutMessage::to_queue("q".into(), "turn", "bad".into(), b"{}".to_vec());
    bad.exchange = format!("{p}.no-such-exchange");
    assert!(publisher.publish(&bad).await.is_err());
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("{p}.after");
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();
    for i in 0..20 {
        let m = OutMessage::to_queue(queue.clone(), "turn", format!("ok-{i}"), b"{}".to_vec());
        publisher.publish(&m).await.unwrap();
    }
    assert!(publisher.is_connected());
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_before_sending() {
    let conn = connect(AMQP).await.unwrap();
    let publisher =
        Publisher::open_with(conn, 1024, std::time::Duration::from_secs(5)).await.unwrap();
    let m = OutMessage::to_queue("anything".into(), "turn", "big".into(), vec![b'x'; 1025]);
    match publisher.publish(&m).await {
        Err(BrokerError::TooLarge { size, limit, .. }) => assert_eq!((size, limit), (1025, 1024)),
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[tokio::test]
async fn connections_use_32_kib_frames_unless_the_url_says_otherwise_and_larger_messages_pass() {
    let conn = connect(AMQP).await.unwrap();
    assert_eq!(conn.configuration().frame_max(), 32_768);
    let own = connect(&format!("{AMQP}?frame_max=65536")).await.unwrap();
    assert_eq!(own.configuration().frame_max(), 65_536, "the operator's URL wins");
    let publisher = Publisher::connect(AMQP).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("{}.frames", prefix());
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();
    // Seven frames' worth, with a pattern a frame boundary would break if mishandled.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let m = OutMessage::to_queue(queue.clone(), "turn", "big".into(), body.clone());
    publisher.publish(&m).await.unwrap();
    let got = ch
        .basic_get(queue.as_str().into(), lapin::options::BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the message is in the queue");
    assert_eq!(got.delivery.data, body);
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}
