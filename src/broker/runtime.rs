//! The consume loop shared by every stage: reconnect with backoff, bounded concurrency, publish
//! with confirm before ack, retries through delay queues, poison accounting, graceful shutdown.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Acker;
use lapin::{Connection, ConnectionProperties};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{
    BrokerError, Delivery, Disposition, Handler, OutMessage, Publisher, StageName, Topology, RETRY_TIERS_MS,
};

/// How a stage consumes.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Broker URL.
    pub amqp_url: String,
    /// Names.
    pub topology: Topology,
    /// Unacked deliveries held at once, which is also the number handled concurrently.
    pub prefetch: u16,
    /// Attempts (first try included) before a transient failure becomes a failed turn.
    pub max_attempts: u32,
    /// Redeliveries after consumer crashes before a message counts as poison.
    pub max_redeliveries: u32,
    /// Longest wait for a publish confirm.
    pub confirm_timeout: Duration,
}

/// Opens a connection with a short heartbeat so a dead broker is noticed in seconds, not minutes.
pub async fn connect(url: &str) -> Result<Connection, BrokerError> {
    let url = if url.contains("heartbeat=") {
        url.to_owned()
    } else {
        format!("{url}{}heartbeat=10", if url.contains('?') { '&' } else { '?' })
    };
    let props = ConnectionProperties::default().with_connection_name("aptix".into());
    Ok(Connection::connect(&url, props).await?)
}

/// Consumes `stage`'s queue until `shutdown` fires, reconnecting after broker failures. On
/// shutdown it stops consuming, lets in-flight messages finish and ack, and returns.
pub async fn run_stage(
    stage: StageName,
    handler: Arc<dyn Handler>,
    settings: RuntimeSettings,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        match consume(stage, &handler, &settings, &shutdown).await {
            Ok(()) => break,
            Err(error) => {
                warn!(stage = stage.as_str(), %error, retry_in_ms = delay.as_millis() as u64, "broker connection lost, reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
    info!(stage = stage.as_str(), "stage stopped");
}

async fn consume(
    stage: StageName,
    handler: &Arc<dyn Handler>,
    settings: &RuntimeSettings,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    // Separate connections: broker flow control on publishers must not stall acks.
    let consume_conn = connect(&settings.amqp_url).await?;
    let publish_conn = connect(&settings.amqp_url).await?;
    let publisher = Publisher::open(&publish_conn).await?;
    settings.topology.declare(publisher.channel()).await?;
    let channel = consume_conn.create_channel().await?;
    channel.basic_qos(settings.prefetch, BasicQosOptions::default()).await?;
    let queue = settings.topology.stage_queue(stage);
    let tag = format!("aptix-{}-{}", stage.as_str(), uuid::Uuid::new_v4());
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    info!(stage = stage.as_str(), queue = %queue, prefetch = settings.prefetch, "consuming");
    crate::metrics::metrics().broker_connection(1);
    let permits = Arc::new(Semaphore::new(usize::from(settings.prefetch.max(1))));
    let tracker = TaskTracker::new();
    let mut ordered = Ordered::default();
    let outcome = loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            next = consumer.next() => next,
        };
        let delivery = match next {
            None => {
                break Err(BrokerError::Amqp(lapin::Error::from(lapin::ErrorKind::InvalidConnectionState(
                    lapin::ConnectionState::Closed,
                ))))
            }
            Some(Err(e)) => break Err(e.into()),
            Some(Ok(d)) => d,
        };
        let job = Job {
            acker: delivery.acker.clone(),
            routing_key: delivery.routing_key.to_string(),
            delivery: detach(&delivery),
        };
        let worker = Worker {
            stage,
            handler: handler.clone(),
            publisher: publisher.clone(),
            settings: settings.clone(),
            permits: permits.clone(),
        };
        match handler.ordering_key(&job.delivery) {
            Some(key) => ordered.dispatch(key, job, worker, &tracker),
            None => {
                tracker.spawn(async move { worker.settle(job).await });
            }
        }
    };
    crate::metrics::metrics().broker_connection(-1);
    let _ = channel.basic_cancel(tag.as_str().into(), Default::default()).await;
    tracker.close();
    tracker.wait().await;
    let _ = channel.close(200, "stage stopping".into()).await;
    let _ = consume_conn.close(200, "stage stopping".into()).await;
    let _ = publish_conn.close(200, "stage stopping".into()).await;
    outcome
}

/// A delivery detached from the consumer, with what is needed to settle it.
struct Job {
    acker: Acker,
    routing_key: String,
    delivery: Delivery,
}

/// What handling a job needs; cheap to clone.
#[derive(Clone)]
struct Worker {
    stage: StageName,
    handler: Arc<dyn Handler>,
    publisher: Publisher,
    settings: RuntimeSettings,
    permits: Arc<Semaphore>,
}

impl Worker {
    async fn settle(&self, job: Job) {
        // The semaphore mirrors prefetch; it only matters if the broker over-delivers.
        let Ok(_permit) = self.permits.acquire().await else { return };
        settle(
            self.stage,
            &*self.handler,
            &self.publisher,
            &self.settings,
            job.delivery,
            &job.acker,
            &job.routing_key,
        )
        .await;
    }
}

/// Per-key FIFO lanes: one task per busy key drains that key's jobs in delivery order.
#[derive(Default)]
struct Ordered {
    lanes: HashMap<String, Arc<std::sync::Mutex<Lane>>>,
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Job>,
    running: bool,
}

impl Ordered {
    fn dispatch(&mut self, key: String, job: Job, worker: Worker, tracker: &TaskTracker) {
        // Idle lanes are dropped so the map only holds keys with work.
        self.lanes.retain(|_, lane| lane.lock().map(|l| l.running || !l.queue.is_empty()).unwrap_or(false));
        let lane = self.lanes.entry(key).or_default().clone();
        let Ok(mut state) = lane.lock() else { return };
        state.queue.push_back(job);
        if state.running {
            return;
        }
        state.running = true;
        drop(state);
        tracker.spawn(async move {
            loop {
                // Taking a job and deciding to stop happen under the same lock as `dispatch`,
                // so no job is left behind in a lane without a task.
                let next = match lane.lock() {
                    Ok(mut l) => match l.queue.pop_front() {
                        Some(job) => job,
                        None => {
                            l.running = false;
                            return;
                        }
                    },
                    Err(_) => return,
                };
                worker.settle(next).await;
            }
        });
    }
}

/// Takes one message from `stage`'s queue, if any, and handles it exactly as the consume loop
/// would. Lets tests drive a stage without sleeping. Returns whether a message was handled.
pub async fn process_one(
    stage: StageName,
    handler: &dyn Handler,
    conn: &Connection,
    publisher: &Publisher,
    settings: &RuntimeSettings,
) -> Result<bool, BrokerError> {
    let channel = conn.create_channel().await?;
    let queue = settings.topology.stage_queue(stage);
    let got = channel.basic_get(queue.as_str().into(), BasicGetOptions::default()).await?;
    let Some(msg) = got else { return Ok(false) };
    let acker = msg.delivery.acker.clone();
    let d = detach(&msg.delivery);
    settle(stage, handler, publisher, settings, d, &acker, queue.as_str()).await;
    let _ = channel.close(200, "done".into()).await;
    Ok(true)
}

fn detach(d: &lapin::message::Delivery) -> Delivery {
    let headers = d.properties.headers().as_ref().map(headers_of).unwrap_or_default();
    let attempt = headers.get("x-aptix-attempt").and_then(|a| a.parse().ok()).unwrap_or(0);
    Delivery {
        body: d.data.clone(),
        message_id: d.properties.message_id().as_ref().map(|m| m.to_string()),
        redelivered: d.redelivered,
        attempt,
        headers,
    }
}

fn headers_of(table: &FieldTable) -> BTreeMap<String, String> {
    table
        .inner()
        .iter()
        .filter_map(|(k, v)| {
            let s = match v {
                AMQPValue::LongString(s) => s.to_string(),
                AMQPValue::ShortString(s) => s.to_string(),
                AMQPValue::LongLongInt(i) => i.to_string(),
                AMQPValue::LongInt(i) => i.to_string(),
                AMQPValue::ShortInt(i) => i.to_string(),
                _ => return None,
            };
            Some((k.to_string(), s))
        })
        .collect()
}

/// Handles one delivery end to end and acks it, or leaves it for redelivery if publishing failed.
async fn settle(
    stage: StageName,
    handler: &dyn Handler,
    publisher: &Publisher,
    settings: &RuntimeSettings,
    d: Delivery,
    acker: &Acker,
    routing_key: &str,
) {
    let queue = settings.topology.stage_queue(stage);
    let _in_flight = crate::metrics::metrics().in_flight(stage.as_str());
    let mut outcome = "forwarded";
    let result = if d.redelivered {
        outcome = "requeued";
        count_redelivery(stage, handler, publisher, settings, d, &queue).await
    } else {
        let trace = super::trace::trace_id_of(&d);
        let span =
            tracing::info_span!("stage", stage = stage.as_str(), trace_id = trace.as_deref().unwrap_or("-"));
        match tracing::Instrument::instrument(handler.handle(d.clone()), span).await {
            Disposition::Forward { mut messages, outbox_ids } => {
                for m in &mut messages {
                    super::trace::stamp(m, &d, trace.as_deref());
                }
                let r = publish_all(publisher, settings, &messages).await;
                if r.is_ok() {
                    handler.published(outbox_ids).await;
                }
                r
            }
            Disposition::Retry { reason } => {
                retry(stage, handler, publisher, settings, d, &queue, reason).await
            }
            Disposition::DeadLetter { reason, messages } => {
                warn!(stage = stage.as_str(), %reason, "dead-lettering message");
                let dead = dead_letter(settings, stage, &d, &reason, routing_key);
                publish_all(publisher, settings, &[messages, vec![dead]].concat()).await
            }
        }
    };
    crate::metrics::metrics()
        .message(stage.as_str(), if result.is_ok() { outcome } else { "publish_failed" });
    match result {
        Ok(()) => {
            // Ok(false) means the channel was recovered meanwhile: the broker redelivers.
            if let Err(error) = acker.ack(BasicAckOptions::default()).await {
                debug!(stage = stage.as_str(), %error, "ack failed, message will be redelivered");
            }
        }
        Err(error) => {
            warn!(stage = stage.as_str(), %error, "publish failed, message will be redelivered");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await;
        }
    }
}

async fn count_redelivery(
    stage: StageName,
    handler: &dyn Handler,
    publisher: &Publisher,
    settings: &RuntimeSettings,
    d: Delivery,
    queue: &str,
) -> Result<(), BrokerError> {
    let count: u32 = d.headers.get("x-aptix-redeliveries").and_then(|c| c.parse().ok()).unwrap_or(0) + 1;
    if count > settings.max_redeliveries {
        let reason = format!("poison: delivered to a consumer that died {count} times");
        warn!(stage = stage.as_str(), count, "dead-lettering poison message");
        return give_up(stage, handler, publisher, settings, d, queue, reason).await;
    }
    // Re-publish with the count so crash loops are bounded; the copy is handled normally.
    let copy = copy_of(d, queue, "x-aptix-redeliveries", count);
    publish_all(publisher, settings, &[copy]).await
}

/// The turn ends here: the handler's fallback messages (an error reply) and a dead letter.
async fn give_up(
    stage: StageName,
    handler: &dyn Handler,
    publisher: &Publisher,
    settings: &RuntimeSettings,
    d: Delivery,
    queue: &str,
    reason: String,
) -> Result<(), BrokerError> {
    let mut messages = handler.exhausted(d.clone(), reason.clone()).await;
    messages.push(dead_letter(settings, stage, &d, &reason, queue));
    publish_all(publisher, settings, &messages).await
}

/// The delivery re-published to `queue` with `counter` set to `value`.
fn copy_of(d: Delivery, queue: &str, counter: &str, value: u32) -> OutMessage {
    let mut copy =
        OutMessage::to_queue(queue.to_owned(), "turn", d.message_id.clone().unwrap_or_default(), d.body);
    copy.headers = d.headers;
    copy.headers.insert(counter.into(), value.to_string());
    copy.headers.remove("x-aptix-kind");
    copy
}

async fn retry(
    stage: StageName,
    handler: &dyn Handler,
    publisher: &Publisher,
    settings: &RuntimeSettings,
    d: Delivery,
    queue: &str,
    reason: String,
) -> Result<(), BrokerError> {
    let next = d.attempt + 1;
    if next >= settings.max_attempts {
        warn!(stage = stage.as_str(), attempts = next, %reason, "retries exhausted");
        let reason = format!("retries exhausted: {reason}");
        return give_up(stage, handler, publisher, settings, d, queue, reason).await;
    }
    let tier = RETRY_TIERS_MS[(d.attempt as usize).min(RETRY_TIERS_MS.len() - 1)];
    info!(stage = stage.as_str(), attempt = next, delay_ms = tier, %reason, "retrying later");
    let mut copy = copy_of(d, queue, "x-aptix-attempt", next);
    copy.exchange = settings.topology.delay_exchange(tier);
    copy.headers.insert("x-aptix-last-error".into(), reason);
    publish_all(publisher, settings, &[copy]).await
}

fn dead_letter(
    settings: &RuntimeSettings,
    stage: StageName,
    d: &Delivery,
    reason: &str,
    from: &str,
) -> OutMessage {
    let id = d.message_id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let mut msg = OutMessage::to_queue(settings.topology.dead(), "dead", id, d.body.clone());
    msg.headers = d.headers.clone();
    msg.headers.remove("x-aptix-kind");
    msg.header("x-aptix-reason", reason)
        .header("x-aptix-stage", stage.as_str())
        .header("x-aptix-original-queue", from)
}

/// Publishes with confirms; a reply whose session queue has expired gets the queue declared
/// and is published once more.
pub async fn publish_all(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    messages: &[OutMessage],
) -> Result<(), BrokerError> {
    let confirmed = messages.iter().map(|m| async move {
        match timed(settings, publisher.publish(m)).await {
            Err(BrokerError::Unroutable { .. }) if m.session.is_some() => {
                if let Some(session) = &m.session {
                    settings.topology.declare_session(publisher.channel(), session).await?;
                }
                timed(settings, publisher.publish(m)).await
            }
            other => other,
        }
    });
    futures_util::future::join_all(confirmed).await.into_iter().collect()
}

async fn timed(
    settings: &RuntimeSettings,
    fut: impl std::future::Future<Output = Result<(), BrokerError>>,
) -> Result<(), BrokerError> {
    tokio::time::timeout(settings.confirm_timeout, fut).await.unwrap_or(Err(BrokerError::ConfirmTimeout))
}
