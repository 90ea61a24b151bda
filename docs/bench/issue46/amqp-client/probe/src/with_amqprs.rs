//! The relay and its driver on amqprs 2 (socket I/O as tokio tasks). amqprs reports confirms
//! to a channel callback, so a publisher numbers its publishes (the broker's delivery tags on a
//! confirm channel) and waits on a oneshot per tag.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicPublishArguments, BasicQosArguments, Channel,
    ConfirmSelectArguments, ConsumerMessage,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties, Cancel, CloseChannel, FieldTable, FieldValue, Nack, Return};
use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::{Names, PREFETCH, SESSION_HEADER, SIZES, TURN_HEADER};

type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<bool>>>>;

/// Resolves the oneshots of confirmed tags (all up to `tag` when `multiple`).
fn settle(pending: &Pending, tag: u64, multiple: bool, ok: bool) {
    let mut map = pending.lock().unwrap();
    let settled = if multiple {
        let rest = map.split_off(&(tag + 1));
        std::mem::replace(&mut *map, rest)
    } else {
        map.remove(&tag).map(|tx| BTreeMap::from([(tag, tx)])).unwrap_or_default()
    };
    drop(map);
    for (_, tx) in settled {
        let _ = tx.send(ok);
    }
}

struct Confirms(Pending);

#[async_trait]
impl ChannelCallback for Confirms {
    async fn close(&mut self, _: &Channel, _: CloseChannel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }
    async fn cancel(&mut self, _: &Channel, _: Cancel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }
    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _: &Channel, ack: Ack) {
        settle(&self.0, ack.delivery_tag(), ack.mutiple(), true);
    }
    async fn publish_nack(&mut self, _: &Channel, nack: Nack) {
        settle(&self.0, nack.delivery_tag(), nack.multiple(), false);
    }
    async fn publish_return(&mut self, _: &Channel, _: Return, _: BasicProperties, _: Vec<u8>) {
        crate::RETURNED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A confirm channel of the pool, with the number of its last publish (the broker numbers a
/// confirm channel's publishes from 1).
struct Confirming {
    ch: Channel,
    pending: Pending,
    last_tag: u64,
}

/// A publishing connection with a pool of confirm channels, one publish outstanding on each:
/// how the pipeline's `Publisher` publishes (one confirm frame per publish).
#[derive(Clone)]
struct Publisher {
    conn: Arc<Connection>,
    idle: Arc<Mutex<Vec<Confirming>>>,
}

impl Publisher {
    async fn open() -> anyhow::Result<Self> {
        Ok(Publisher { conn: Arc::new(open().await?), idle: Arc::default() })
    }

    async fn channel(&self) -> anyhow::Result<Confirming> {
        if let Some(c) = self.idle.lock().unwrap().pop() {
            return Ok(c);
        }
        let ch = self.conn.open_channel(None).await?;
        let pending: Pending = Arc::default();
        ch.register_callback(Confirms(pending.clone())).await?;
        ch.confirm_select(ConfirmSelectArguments::default()).await?;
        Ok(Confirming { ch, pending, last_tag: 0 })
    }

    async fn publish(&self, queue: &str, body: Vec<u8>, headers: FieldTable) -> anyhow::Result<()> {
        let props = BasicProperties::default()
            .with_persistence(true)
            .with_content_type("application/json")
            .with_message_type("turn")
            .with_message_id(&format!("m{}", rand::random::<u64>()))
            .with_headers(headers)
            .finish();
        let args = BasicPublishArguments::new("", queue).mandatory(true).finish();
        let mut c = self.channel().await?;
        // One publish outstanding on the channel: its tag is the channel's next. A failed
        // publish drops the channel, whose numbering can no longer be trusted.
        c.last_tag += 1;
        let (tx, rx) = oneshot::channel();
        c.pending.lock().unwrap().insert(c.last_tag, tx);
        c.ch.basic_publish(props, body, args).await?;
        anyhow::ensure!(rx.await?, "nacked");
        self.idle.lock().unwrap().push(c);
        Ok(())
    }
}

async fn open() -> anyhow::Result<Connection> {
    let args =
        OpenConnectionArguments::new("127.0.0.1", 5672, "guest", "guest").heartbeat(5).finish();
    Ok(Connection::open(&args).await?)
}

async fn consumer(
    queue: &str,
    prefetch: u16,
) -> anyhow::Result<(Channel, mpsc::UnboundedReceiver<ConsumerMessage>, Connection)> {
    let conn = open().await?;
    let ch = conn.open_channel(None).await?;
    ch.basic_qos(BasicQosArguments::new(0, prefetch, false)).await?;
    let args = BasicConsumeArguments::new(queue, "").manual_ack(true).finish();
    let (_, rx) = ch.basic_consume_rx(args).await?;
    Ok((ch, rx, conn))
}

fn long(s: String) -> FieldValue {
    FieldValue::S(s.try_into().expect("short enough"))
}

/// Starts the five relay stages and `sessions` closed-loop sessions counting into `done`.
pub async fn start(names: &Names, sessions: usize, done: Arc<AtomicU64>) -> anyhow::Result<()> {
    for i in 0..5 {
        let (cch, mut deliveries, cconn) = consumer(&names.stages[i], PREFETCH[i]).await?;
        let publisher = Publisher::open().await?;
        let next = names.next(i);
        let body: Arc<Vec<u8>> = Arc::new(vec![b'x'; SIZES[i + 1]]);
        tokio::spawn(async move {
            let _keep = cconn;
            while let Some(m) = deliveries.recv().await {
                let (cch, publisher, next, body) =
                    (cch.clone(), publisher.clone(), next.clone(), body.clone());
                tokio::spawn(async move {
                    let tag = m.deliver.as_ref().map(|d| d.delivery_tag()).unwrap_or(0);
                    let headers = m
                        .basic_properties
                        .as_ref()
                        .and_then(|p| p.headers().cloned())
                        .unwrap_or_default();
                    if publisher.publish(&next, body.to_vec(), headers).await.is_ok() {
                        let _ = cch.basic_ack(BasicAckArguments::new(tag, false)).await;
                    }
                });
            }
        });
    }
    let publisher = Publisher::open().await?;
    let (cch, mut replies, cconn) = consumer(&names.reply, 1024).await?;
    let mut inboxes = Vec::new();
    for s in 0..sessions {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        inboxes.push(tx);
        let (publisher, first, done) = (publisher.clone(), names.stages[0].clone(), done.clone());
        tokio::spawn(async move {
            for turn in 0u64.. {
                let mut h = FieldTable::new();
                h.insert(SESSION_HEADER.try_into().unwrap(), long(s.to_string()));
                h.insert(TURN_HEADER.try_into().unwrap(), long(turn.to_string()));
                let body = vec![b'r'; SIZES[0]];
                if publisher.publish(&first, body, h).await.is_err() || rx.recv().await.is_none() {
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let key = SESSION_HEADER.try_into().unwrap();
    tokio::spawn(async move {
        let _keep = cconn;
        while let Some(m) = replies.recv().await {
            let session =
                m.basic_properties.as_ref().and_then(|p| p.headers()).and_then(|h| h.get(&key));
            let s = match session {
                Some(FieldValue::S(v)) => String::from(v.clone()).parse::<usize>().ok(),
                _ => None,
            };
            if let Some(tx) = s.and_then(|s| inboxes.get(s)) {
                let _ = tx.send(());
            }
            let tag = m.deliver.as_ref().map(|d| d.delivery_tag()).unwrap_or(0);
            let _ = cch.basic_ack(BasicAckArguments::new(tag, false)).await;
        }
    });
    Ok(())
}
