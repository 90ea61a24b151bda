//! The relay and its driver on lapin 4 (socket I/O on a thread per connection). Also declares
//! and deletes the run's queues for both clients.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use tokio::sync::mpsc;

use crate::{Names, PREFETCH, SESSION_HEADER, SIZES, TURN_HEADER};

pub struct Setup(Channel, #[allow(dead_code)] Connection);

impl Setup {
    pub async fn delete(self, names: &Names) -> anyhow::Result<()> {
        for q in names.all() {
            self.0.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?;
        }
        Ok(())
    }
}

/// Declares the run's durable queues.
pub async fn declare(url: &str, names: &Names) -> anyhow::Result<Setup> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    for q in names.all() {
        let opts = QueueDeclareOptions { durable: true, ..Default::default() };
        ch.queue_declare(q.as_str().into(), opts, FieldTable::default()).await?;
    }
    Ok(Setup(ch, conn))
}

/// A publishing connection with a pool of confirm channels, one publish outstanding on each:
/// how the pipeline's `Publisher` publishes (one confirm frame per publish).
#[derive(Clone)]
struct Pool {
    conn: Arc<Connection>,
    idle: Arc<Mutex<Vec<Channel>>>,
}

impl Pool {
    async fn open(url: &str) -> anyhow::Result<Pool> {
        let conn = Connection::connect(url, ConnectionProperties::default()).await?;
        Ok(Pool { conn: Arc::new(conn), idle: Arc::default() })
    }

    async fn publish(&self, queue: &str, body: &[u8], headers: FieldTable) -> anyhow::Result<()> {
        let idle = self.idle.lock().unwrap().pop();
        let ch = match idle {
            Some(ch) => ch,
            None => {
                let ch = self.conn.create_channel().await?;
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                ch
            }
        };
        publish(&ch, queue, body, headers).await?;
        self.idle.lock().unwrap().push(ch);
        Ok(())
    }
}

async fn consumer(url: &str, queue: &str, prefetch: u16) -> anyhow::Result<(Consumer, Connection)> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let opts = BasicConsumeOptions::default();
    let c = ch.basic_consume(queue.into(), "".into(), opts, FieldTable::default()).await?;
    Ok((c, conn))
}

/// Publishes `body` to the default exchange with routing key `queue`, waits for its confirm.
async fn publish(
    ch: &Channel,
    queue: &str,
    body: &[u8],
    headers: FieldTable,
) -> anyhow::Result<()> {
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_type("turn".into())
        .with_message_id(format!("m{}", rand::random::<u64>()).into())
        .with_headers(headers);
    let opts = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm = ch.basic_publish("".into(), queue.into(), opts, body, props).await?.await?;
    anyhow::ensure!(!confirm.is_nack(), "nacked");
    if confirm.take_message().is_some() {
        crate::RETURNED.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn header(props: &BasicProperties, key: &str) -> Option<String> {
    let h = props.headers().as_ref()?.inner().get(key)?;
    AMQPValue::as_long_string(h).map(|s| s.to_string())
}

/// Starts the five relay stages and `sessions` closed-loop sessions counting into `done`.
pub async fn start(
    url: &str,
    names: &Names,
    sessions: usize,
    done: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    for i in 0..5 {
        let (mut deliveries, cconn) = consumer(url, &names.stages[i], PREFETCH[i]).await?;
        let pool = Pool::open(url).await?;
        let next = names.next(i);
        let body: Arc<Vec<u8>> = Arc::new(vec![b'x'; SIZES[i + 1]]);
        tokio::spawn(async move {
            let _keep = cconn;
            while let Some(Ok(d)) = deliveries.next().await {
                let (pool, next, body) = (pool.clone(), next.clone(), body.clone());
                tokio::spawn(async move {
                    let headers = d.properties.headers().clone().unwrap_or_default();
                    if pool.publish(&next, &body, headers).await.is_ok() {
                        let _ = d.acker.ack(BasicAckOptions::default()).await;
                    }
                });
            }
        });
    }
    // The driver: requests on a confirm channel, replies dispatched to their session.
    let pool = Pool::open(url).await?;
    let (mut replies, cconn) = consumer(url, &names.reply, 1024).await?;
    let mut inboxes = Vec::new();
    for s in 0..sessions {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        inboxes.push(tx);
        let (pool, first, done) = (pool.clone(), names.stages[0].clone(), done.clone());
        tokio::spawn(async move {
            let body = vec![b'r'; SIZES[0]];
            for turn in 0u64.. {
                let mut h = FieldTable::default();
                h.insert(
                    SESSION_HEADER.into(),
                    AMQPValue::LongString(LongString::from(s.to_string())),
                );
                h.insert(
                    TURN_HEADER.into(),
                    AMQPValue::LongString(LongString::from(turn.to_string())),
                );
                if pool.publish(&first, &body, h).await.is_err() || rx.recv().await.is_none() {
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::spawn(async move {
        let _keep = cconn;
        while let Some(Ok(d)) = replies.next().await {
            let s = header(&d.properties, SESSION_HEADER).and_then(|s| s.parse::<usize>().ok());
            if let Some(tx) = s.and_then(|s| inboxes.get(s)) {
                let _ = tx.send(());
            }
            // Not awaited here: lapin's ack resolves once its I/O thread wrote the frame.
            tokio::spawn(async move { d.acker.ack(BasicAckOptions::default()).await });
        }
    });
    Ok(())
}

/// Consumes one message of `queue` (left unacked) and says what lapin made of it.
pub async fn get_one(queue: &str) -> anyhow::Result<()> {
    let (mut deliveries, conn) =
        consumer("amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=5", queue, 1).await?;
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), deliveries.next()).await;
    match got {
        Ok(Some(Ok(d))) => println!("delivered: reply_to {:?}", d.properties.reply_to()),
        Ok(Some(Err(e))) => println!("consumer error: {e}"),
        Ok(None) => println!("consumer ended"),
        Err(_) => println!("nothing in 5 s"),
    }
    println!("connection connected after: {}", conn.status().connected());
    Ok(())
}
