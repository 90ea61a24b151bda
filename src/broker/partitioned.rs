//! Consuming a changing set of ingress partitions: one connection, a channel per partition held,
//! and a hand-over that keeps each session's requests in order.
//!
//! Taking a partition subscribes to its queue; the broker makes the subscription active once no
//! other worker's is (single active consumer). Giving one up stops reading it, waits until its
//! in-flight messages are settled, then closes its channel: the broker returns what was
//! prefetched but never read to the head of the queue, and only then activates the next
//! consumer, which so continues exactly where this one stopped. (Cancelling the consumer first
//! would activate the next one while this one still held earlier messages. lapin cancels a
//! subscription when the last handle to its consumer is dropped, so a held partition keeps one
//! until its channel is closed.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, SelectAll, StreamExt as _};
use futures_util::Stream;
use lapin::{Channel, Connection};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use super::lanes::{InFlight, Job, Ordered, Worker};
use super::runtime::{connections, reconnecting, subscribe};
use super::settings::SETUP_TIMEOUT;
use super::wind_down::{dead, Ended};
use super::{BrokerError, Handler, Publisher, RuntimeSettings, StageName};

/// A partition this worker holds.
struct Held {
    /// Tells this holding's stream end from an earlier holding's of the same partition.
    generation: u64,
    channel: Channel,
    /// Kept until the channel is closed: dropping the last handle sends `basic.cancel`.
    consumer: lapin::Consumer,
    /// Ends the partition's delivery stream.
    stop: CancellationToken,
    in_flight: Arc<InFlight>,
}

enum Event {
    Delivery(u16, Result<lapin::message::Delivery, lapin::Error>),
    /// A partition's stream ended (partition, generation): given up by us, or its channel
    /// closed under us.
    Ended(u16, u64),
}

type Events = std::pin::Pin<Box<dyn Stream<Item = Event> + Send>>;

/// Consumes the ingress partitions named by `share` (indexes into the topology's ingress queues)
/// as they change, until `shutdown` fires; reconnects after broker failures.
pub async fn run_partitioned(
    stage: StageName,
    handler: Arc<dyn Handler>,
    settings: RuntimeSettings,
    share: watch::Receiver<BTreeSet<u16>>,
    shutdown: CancellationToken,
) {
    let connected = || {
        let mut session = Partitions::new(stage, &handler, &settings, share.clone(), &shutdown);
        async move { session.run().await }
    };
    reconnecting(stage, &shutdown, connected).await;
}

/// One connection's worth of partition consuming.
struct Partitions<'a> {
    stage: StageName,
    handler: &'a Arc<dyn Handler>,
    settings: &'a RuntimeSettings,
    share: watch::Receiver<BTreeSet<u16>>,
    shutdown: &'a CancellationToken,
    held: BTreeMap<u16, Held>,
    tracker: TaskTracker,
    generation: u64,
}

impl<'a> Partitions<'a> {
    fn new(
        stage: StageName,
        handler: &'a Arc<dyn Handler>,
        settings: &'a RuntimeSettings,
        share: watch::Receiver<BTreeSet<u16>>,
        shutdown: &'a CancellationToken,
    ) -> Self {
        let (held, tracker) = (BTreeMap::new(), TaskTracker::new());
        Partitions { stage, handler, settings, share, shutdown, held, tracker, generation: 0 }
    }

    async fn run(&mut self) -> Result<(), BrokerError> {
        let setup = tokio::time::timeout(SETUP_TIMEOUT, self.open());
        let (conn, publisher) = tokio::select! {
            _ = self.shutdown.cancelled() => return Ok(()),
            opened = setup => opened.map_err(|_| BrokerError::SetupTimeout)??,
        };
        crate::metrics::metrics().broker_connection(1);
        // Ends in-place retry waits when this connection breaks (see `runtime::consume`).
        let connection = self.shutdown.child_token();
        let worker = Worker::new(self.stage, self.handler, &publisher, self.settings, &connection);
        let outcome = self.dispatch(&conn, &worker).await;
        if outcome.is_err() {
            connection.cancel();
        }
        crate::metrics::metrics().broker_connection(-1);
        let dead = dead(&conn, &outcome);
        for (partition, held) in std::mem::take(&mut self.held) {
            self.release(partition, held, dead);
        }
        let tracker = self.tracker.clone();
        let ended = Ended { stage: self.stage, tracker, conn, publisher, channel: None };
        ended.wind_down(outcome).await
    }

    async fn open(&self) -> Result<(Connection, Publisher), BrokerError> {
        let (conn, publisher) = connections(self.settings, self.stage).await?;
        self.settings.topology.declare(publisher.channel()).await?;
        Ok((conn, publisher))
    }

    /// Follows the share and hands deliveries to lanes until shutdown or a broken connection.
    async fn dispatch(&mut self, conn: &Connection, worker: &Worker) -> Result<(), BrokerError> {
        let mut events: SelectAll<Events> = SelectAll::new();
        let mut ordered = Ordered::default();
        let mut watch = tokio::time::interval(Duration::from_secs(1));
        loop {
            let wanted = self.share.borrow_and_update().clone();
            self.follow(conn, &wanted, &mut events).await?;
            let event = tokio::select! {
                _ = self.shutdown.cancelled() => return Ok(()),
                changed = self.share.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return Ok(()), // the share's owner stopped: shutting down
                },
                _ = watch.tick() => {
                    if worker.publisher.is_connected() {
                        continue;
                    }
                    return Err(BrokerError::Closed);
                }
                Some(event) = events.next(), if !events.is_empty() => event,
            };
            match event {
                Event::Delivery(_, Err(e)) => return Err(e.into()),
                Event::Delivery(p, Ok(d)) => {
                    let in_flight = self.held.get(&p).map(|h| &h.in_flight);
                    let job = Job::new(d, true, worker, in_flight);
                    ordered.route(job, worker, &self.tracker);
                }
                Event::Ended(p, generation) => {
                    let current = self.held.get(&p).filter(|h| h.generation == generation);
                    if current.is_some_and(|h| !h.stop.is_cancelled()) {
                        return Err(BrokerError::Closed);
                    }
                }
            }
        }
    }

    /// Gives up partitions no longer wanted and takes the newly wanted ones.
    async fn follow(
        &mut self,
        conn: &Connection,
        wanted: &BTreeSet<u16>,
        events: &mut SelectAll<Events>,
    ) -> Result<(), BrokerError> {
        let gone: Vec<u16> = self.held.keys().filter(|p| !wanted.contains(p)).copied().collect();
        for partition in gone {
            if let Some(held) = self.held.remove(&partition) {
                self.release(partition, held, false);
            }
        }
        for &partition in wanted {
            if !self.held.contains_key(&partition) {
                let (held, stream) = self.take(conn, partition).await?;
                self.held.insert(partition, held);
                events.push(stream);
            }
        }
        Ok(())
    }

    async fn take(
        &mut self,
        conn: &Connection,
        partition: u16,
    ) -> Result<(Held, Events), BrokerError> {
        let queues = self.settings.topology.ingress_queues();
        let Some(queue) = queues.get(usize::from(partition)) else {
            return Err(BrokerError::Closed);
        };
        let tag = format!("aptix-{}-p{partition}-{}", self.stage.as_str(), uuid::Uuid::new_v4());
        let (channel, consumer) = subscribe(conn, self.settings.prefetch, queue, &tag).await?;
        info!(stage = self.stage.as_str(), queue = %queue, partition, "took ingress partition");
        let stop = CancellationToken::new();
        self.generation += 1;
        let generation = self.generation;
        let deliveries = consumer
            .clone()
            .map(move |d| Event::Delivery(partition, d))
            .take_until(stop.clone().cancelled_owned())
            .chain(stream::once(async move { Event::Ended(partition, generation) }));
        let held = Held { generation, channel, consumer, stop, in_flight: Arc::default() };
        Ok((held, Box::pin(deliveries)))
    }

    /// Stops reading `partition`, and closes its channel once its in-flight messages are settled.
    /// The channel of a `dead` connection is dropped at once: the broker has its messages back,
    /// and a close would wait for an answer that never comes (see `wind_down`).
    fn release(&self, partition: u16, held: Held, dead: bool) {
        held.stop.cancel();
        let stage = self.stage;
        if dead {
            drop(held);
            info!(stage = stage.as_str(), partition, "let go of ingress partition");
            return;
        }
        self.tracker.spawn(async move {
            held.in_flight.settled().await;
            if held.channel.status().connected() {
                let closing = held.channel.close(200, "partition handed over".into());
                let _ = tokio::time::timeout(SETUP_TIMEOUT, closing).await;
            }
            // Only now: the broker has the channel's unsettled messages back (see the module doc).
            drop(held.consumer);
            info!(stage = stage.as_str(), partition, "gave up ingress partition");
        });
    }
}
