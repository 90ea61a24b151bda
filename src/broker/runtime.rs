//! The consume loop shared by every stage: reconnect with backoff, bounded concurrency, per-key
//! ordered lanes, graceful shutdown. What happens to each message is `settle`'s business.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::SelectAll;
use futures_util::StreamExt as _;
use lapin::options::{BasicGetOptions, BasicQosOptions};
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::delivery::detach;
use super::lanes::{Job, Ordered, Worker};
pub use super::settings::RuntimeSettings;
use super::settings::SETUP_TIMEOUT;
use super::settle::Settler;
use super::stage_consumers::{consume_on, ended, StageConsumers};
use super::wind_down::{dead, Ended, BROKEN_SETTLE};
use super::{BrokerError, Handler, Publisher, StageName};

/// The largest AMQP frame a connection reading clients' messages takes: RabbitMQ's default
/// `frame_max`, which deploy/rabbitmq/rabbitmq.conf pins. RabbitMQ never splits a message's
/// properties across frames, so a client may publish a properties frame as large as the broker
/// takes; a reader with smaller frames has its connection closed by lapin, and the broker hands
/// the message to the next reader, for ever.
pub const CLIENT_FRAME_MAX: u32 = 131_072;

/// The frames a connection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frames {
    /// 32 KiB: the pipeline's own messages (stage queues), whose properties it bounds.
    Own,
    /// [`CLIENT_FRAME_MAX`]: clients' messages (the ingress, dead letters, a tool's look).
    Clients,
}

/// Opens a connection to `urls`: one broker URL, or a cluster's nodes separated by commas. The
/// nodes are tried in turn from a random one, so a fleet spreads over the cluster and a node that
/// is down costs one refused attempt; the error is the last node's. A short heartbeat notices a
/// dead broker in seconds, not minutes.
pub async fn connect(urls: &str) -> Result<Connection, BrokerError> {
    connect_named(urls, "aptix", Frames::Own).await
}

/// Like [`connect`], the connection carrying `name` (the management UI and API show it) and
/// reading `frames`.
pub async fn connect_named(
    urls: &str,
    name: &str,
    frames: Frames,
) -> Result<Connection, BrokerError> {
    let nodes: Vec<&str> = urls.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    let start = if nodes.len() > 1 { rand::random_range(0..nodes.len()) } else { 0 };
    let mut last = BrokerError::Closed;
    for i in 0..nodes.len() {
        let node = nodes[(start + i) % nodes.len()];
        match connect_node(node, name, frames).await {
            Ok(conn) => return Ok(conn),
            Err(error) => {
                if nodes.len() > 1 {
                    let node = crate::config::redact_url(node);
                    warn!(%node, %error, "broker node unavailable, trying the next");
                }
                last = error;
            }
        }
    }
    Err(last)
}

async fn connect_node(url: &str, name: &str, frames: Frames) -> Result<Connection, BrokerError> {
    // A connection to a node that died unseen (no reset: a network partition, a frozen host) is
    // noticed only by its missed heartbeats, two intervals; 5 s is RabbitMQ's lowest recommended
    // value. (The 20 s holds once blamed on the 10 s default were `wind_down`'s.)
    let url = with_default(url, "heartbeat", "5");
    // lapin keeps 32 frames of `frame_max` per direction for every connection, zero-filled: 8 MiB
    // at RabbitMQ's 128 KiB, half the pipeline's heap under load; a usual stage message fits in
    // one 32 KiB frame, and larger ones are split, as AMQP allows. Clients' messages need the
    // broker's frames (`CLIENT_FRAME_MAX`), on the few connections that read them.
    let url = match frames {
        Frames::Own => with_default(&url, "frame_max", "32768"),
        Frames::Clients => with_frame_max(&url, CLIENT_FRAME_MAX),
    };
    let props = ConnectionProperties::default().with_connection_name(name.into());
    // A node that accepts TCP and does not answer must not hold up the move to the next one.
    match tokio::time::timeout(NODE_CONNECT_TIMEOUT, Connection::connect(&url, props)).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(BrokerError::SetupTimeout),
    }
}

/// `url` asking for frames of `frame_max`, whatever frame size the URL asks for.
fn with_frame_max(url: &str, frame_max: u32) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return format!("{url}?frame_max={frame_max}");
    };
    let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("frame_max=")).collect();
    let sep = if kept.iter().any(|p| !p.is_empty()) { "&" } else { "" };
    format!("{base}?{}{sep}frame_max={frame_max}", kept.join("&"))
}

/// `url` with `key=value` in its query, unless the URL sets `key` itself.
fn with_default(url: &str, key: &str, value: &str) -> String {
    if url.contains(&format!("{key}=")) {
        return url.to_owned();
    }
    format!("{url}{}{key}={value}", if url.contains('?') { '&' } else { '?' })
}

/// Longest wait for one node to accept a connection before the next one is tried.
const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Consumes `stage`'s queue until `shutdown` fires, reconnecting after broker failures. On
/// shutdown it stops consuming, lets in-flight messages finish and ack, and returns.
pub async fn run_stage(
    stage: StageName,
    handler: Arc<dyn Handler>,
    settings: RuntimeSettings,
    shutdown: CancellationToken,
) {
    reconnecting(stage, &shutdown, || consume(stage, &handler, &settings, &shutdown)).await;
}

/// How long a worker waits before it looks again for a plugin the broker lacks.
const MISSING_PLUGIN_WAIT: Duration = Duration::from_secs(10);

/// Runs `connected` (one connection's worth of consuming) again after each broker failure,
/// until it ends cleanly or `shutdown` fires. The back-off grows from 200 ms to 5 s and starts
/// over after a connection that lasted a minute.
pub(super) async fn reconnecting<F, Fut>(
    stage: StageName,
    shutdown: &CancellationToken,
    mut connected: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BrokerError>>,
{
    const FIRST: Duration = Duration::from_millis(200);
    let mut delay = FIRST;
    while !shutdown.is_cancelled() {
        let began = std::time::Instant::now();
        let Err(error) = connected().await else { break };
        if began.elapsed() > Duration::from_secs(60) {
            delay = FIRST;
        }
        if let Some(problem) = error.missing_plugin() {
            // Nothing a reconnect can mend: an operator must enable the plugin.
            tracing::error!(stage = stage.as_str(), %error, retry_in_ms = MISSING_PLUGIN_WAIT.as_millis() as u64, "{problem}");
            crate::metrics::metrics().broker_problem(Some(problem));
            delay = MISSING_PLUGIN_WAIT;
        } else if error.unreadable_delivery() {
            // Comes back on every connection: on a classic queue, until an operator removes it.
            tracing::error!(stage = stage.as_str(), %error, retry_in_ms = delay.as_millis() as u64,
                "a message in this stage's queue cannot be read by the AMQP client and is redelivered to every connection: see docs/tenancy.md §8");
        } else {
            warn!(stage = stage.as_str(), %error, retry_in_ms = delay.as_millis() as u64, "broker connection lost, reconnecting");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
    info!(stage = stage.as_str(), "stage stopped");
}

async fn consume(
    stage: StageName,
    handler: &Arc<dyn Handler>,
    settings: &RuntimeSettings,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    // A set-up that stalls (a broker mid-restart can accept TCP and not answer) must neither
    // hang the worker nor keep it from stopping.
    let setup = tokio::time::timeout(SETUP_TIMEOUT, open(stage, settings));
    let (consume_conn, publisher, mut consumers) = tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        opened = setup => opened.map_err(|_| BrokerError::SetupTimeout)??,
    };
    let queue = settings.topology.stage_queue(stage);
    let queues = consumers.queues();
    info!(stage = stage.as_str(), queue = %queue, queues, prefetch = settings.prefetch, "consuming");
    crate::metrics::metrics().broker_connection(1);
    let tracker = TaskTracker::new();
    // Ends in-place retry waits when this connection breaks: the broker has already taken its
    // unacknowledged messages back, so nothing in flight here can be settled any more.
    let connection = shutdown.child_token();
    let worker = Worker::new(stage, handler, &publisher, settings, &connection);
    let outcome = dispatch(&worker, &mut consumers.deliveries, &tracker).await;
    if outcome.is_err() {
        connection.cancel();
    }
    crate::metrics::metrics().broker_connection(-1);
    // The ingress queue has a single active consumer: cancelling would activate the standby
    // while this one still holds earlier requests. Its channel is only closed once they are
    // settled, which returns the rest in order (see `partitioned`). A dead connection's
    // consumers are gone with it, and cancelling them would wait for no answer.
    let channel = if settings.topology.is_ingress(stage) || dead(&consume_conn, &outcome) {
        consumers.channel
    } else {
        let limit = if outcome.is_err() { BROKEN_SETTLE } else { SETUP_TIMEOUT };
        consumers.cancel(limit).await
    };
    let ended = Ended { stage, tracker, conn: consume_conn, publisher, channel: Some(channel) };
    ended.wind_down(outcome).await
}

/// Hands each delivery to a task (in order per ordering key) until shutdown or a broken
/// connection.
async fn dispatch(
    worker: &Worker,
    consumer: &mut SelectAll<super::stage_consumers::Deliveries>,
    tracker: &TaskTracker,
) -> Result<(), BrokerError> {
    let stage = worker.stage;
    let ingress = worker.settings.topology.is_ingress(stage);
    let mut ordered = Ordered::default();
    let mut watch = tokio::time::interval(Duration::from_secs(1));
    loop {
        let next = tokio::select! {
            _ = worker.shutdown.cancelled() => return Ok(()),
            next = consumer.next() => next,
            // A dead publishing connection must not leave the stage consuming what it can
            // never forward: reconnect both.
            _ = watch.tick() => {
                if worker.publisher.is_connected() {
                    continue;
                }
                return Err(BrokerError::Closed);
            }
        };
        let delivery = match next {
            None => return Err(BrokerError::Amqp(ended())),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(d)) => d,
        };
        let job = Job::new(delivery, ingress, worker, None);
        ordered.route(job, worker, tracker);
    }
}

type Opened = (Connection, Publisher, StageConsumers);

/// Connects, declares the topology and starts consuming `stage`'s queues on one channel.
async fn open(stage: StageName, settings: &RuntimeSettings) -> Result<Opened, BrokerError> {
    let (consume_conn, publisher) = connections(settings, stage).await?;
    if settings.topology.is_ingress(stage) {
        settings.topology.declare(publisher.channel()).await?;
    } else {
        settings.topology.declare_downstream(publisher.channel()).await?;
    }
    let consumers = StageConsumers::open(&consume_conn, settings, stage).await?;
    Ok((consume_conn, publisher, consumers))
}

/// A connection to consume on, named after the worker so the broker's consumers of a queue are
/// its workers, and a publisher on a connection of its own: broker flow control on publishers
/// must not stall acks.
pub(super) async fn connections(
    settings: &RuntimeSettings,
    stage: StageName,
) -> Result<(Connection, Publisher), BrokerError> {
    let name = super::management::worker_name(stage.as_str());
    // The ingress holds what clients wrote, properties frames as large as the broker takes.
    let frames = if settings.topology.is_ingress(stage) { Frames::Clients } else { Frames::Own };
    let consume_conn = connect_named(&settings.amqp_url, &name, frames).await?;
    let publish_conn = connect(&settings.amqp_url).await?;
    let publisher =
        Publisher::open_with(publish_conn, settings.max_message_bytes, settings.confirm_timeout)
            .await?;
    Ok((consume_conn, publisher))
}

/// A channel of `conn` consuming `queue` with manual acks, at most `prefetch` unacked.
pub(super) async fn subscribe(
    conn: &Connection,
    prefetch: u16,
    queue: &str,
    tag: &str,
) -> Result<(lapin::Channel, lapin::Consumer), BrokerError> {
    let channel = conn.create_channel().await?;
    channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let consumer = consume_on(&channel, queue, tag).await?;
    Ok((channel, consumer))
}

/// Takes one message from `stage`'s queues (its single queue first, then its partitions), if
/// any, and handles it exactly as the consume loop would. Lets tests drive a stage without
/// sleeping. Returns whether a message was handled.
pub async fn process_one(
    stage: StageName,
    handler: &dyn Handler,
    conn: &Connection,
    publisher: &Publisher,
    settings: &RuntimeSettings,
) -> Result<bool, BrokerError> {
    let channel = conn.create_channel().await?;
    let mut got = None;
    for queue in settings.topology.consumed_queues(stage) {
        got = channel.basic_get(queue.as_str().into(), BasicGetOptions::default()).await?;
        if got.is_some() {
            break;
        }
    }
    let Some(mut msg) = got else { return Ok(false) };
    let keys = settings.keys.as_ref();
    let d = detach(&mut msg.delivery, settings.topology.is_ingress(stage), keys, handler);
    let acker = msg.delivery.acker;
    let shutdown = CancellationToken::new();
    let settler = Settler { stage, handler, publisher, settings, shutdown: &shutdown };
    settler.settle(d, &acker).await;
    let _ = channel.close(200, "done".into()).await;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::with_frame_max;

    #[test]
    fn a_clients_reader_asks_for_the_brokers_frames_whatever_the_url_says() {
        let url = "amqp://u:p@h:5672/%2f";
        assert_eq!(with_frame_max(url, 9), format!("{url}?frame_max=9"));
        assert_eq!(
            with_frame_max(&format!("{url}?frame_max=4096"), 9),
            format!("{url}?frame_max=9")
        );
        assert_eq!(
            with_frame_max(&format!("{url}?heartbeat=5&frame_max=4096&channel_max=8"), 9),
            format!("{url}?heartbeat=5&channel_max=8&frame_max=9")
        );
    }
}
