//! Consuming one stage's queues on one channel: its single queue, its partitions
//! (`stage_partitions`), and those of the earlier layouts being drained
//! (`draining_stage_partitions`). A consumer the broker ends (its queue deleted, its node lost) ends
//! the connection's consuming, as a single consumer's end always did: the runtime reconnects
//! and subscribes to every queue again, rather than leave a partition unread.

use std::pin::Pin;

use futures_util::stream::{self, SelectAll};
use futures_util::{Stream, StreamExt as _};
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use super::{BrokerError, RuntimeSettings, StageName};

pub(super) type Deliveries =
    Pin<Box<dyn Stream<Item = Result<lapin::message::Delivery, lapin::Error>> + Send>>;

/// A stage's consumers, their deliveries merged.
pub(super) struct StageConsumers {
    pub channel: Channel,
    pub deliveries: SelectAll<Deliveries>,
    tags: Vec<String>,
}

impl StageConsumers {
    /// Subscribes to every queue of `stage` (see the module doc). The single queue gets the
    /// stage's whole prefetch (retries and requeues come back to it, and must not drain at a
    /// partition's pace); the partitions of each layout share one, each at least 1. The
    /// runtime's semaphore still handles at most the prefetch at once.
    pub async fn open(
        conn: &Connection,
        settings: &RuntimeSettings,
        stage: StageName,
    ) -> Result<Self, BrokerError> {
        let topology = &settings.topology;
        let single = topology.stage_queue(stage);
        let channel = conn.create_channel().await?;
        let mut consumers = StageConsumers { channel, deliveries: SelectAll::new(), tags: vec![] };
        consumers.subscribe(stage, settings.prefetch, &[single]).await?;
        for layout in topology.stage_layouts(stage) {
            // Each layout shares one prefetch among its partitions.
            let prefetch = settings.prefetch.div_ceil(layout.partitions).max(1);
            consumers.subscribe(stage, prefetch, &layout.queues).await?;
        }
        Ok(consumers)
    }

    /// How many queues are consumed.
    pub fn queues(&self) -> usize {
        self.tags.len()
    }

    async fn subscribe(
        &mut self,
        stage: StageName,
        prefetch: u16,
        queues: &[String],
    ) -> Result<(), BrokerError> {
        if queues.is_empty() {
            return Ok(());
        }
        // A per-consumer limit: it applies to the consumers started after it.
        self.channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
        for queue in queues {
            let tag = format!("aptix-{}-{}", stage.as_str(), uuid::Uuid::new_v4());
            let consumer = consume_on(&self.channel, queue, &tag).await?;
            let ended = stream::once(async { Err(ended()) });
            self.deliveries.push(Box::pin(consumer.chain(ended)));
            self.tags.push(tag);
        }
        Ok(())
    }

    /// Stops every subscription at once, waiting at most `limit` in all, and gives back the
    /// channel (to be closed once what it delivered is settled).
    pub async fn cancel(self, limit: std::time::Duration) -> Channel {
        // The consumers live until their cancels are answered: lapin would cancel them on its
        // own when the last handle went.
        let StageConsumers { channel, deliveries, tags } = self;
        let cancels =
            tags.iter().map(|tag| channel.basic_cancel(tag.as_str().into(), Default::default()));
        let all = futures_util::future::join_all(cancels);
        let _ = tokio::time::timeout(limit, all).await;
        drop(deliveries);
        channel
    }
}

/// A consumer of `queue` on `channel`, with manual acks.
pub(super) async fn consume_on(
    channel: &Channel,
    queue: &str,
    tag: &str,
) -> Result<lapin::Consumer, BrokerError> {
    let options = BasicConsumeOptions::default();
    Ok(channel.basic_consume(queue.into(), tag.into(), options, FieldTable::default()).await?)
}

/// What an ended consumer yields: the end of this connection's consuming.
pub(super) fn ended() -> lapin::Error {
    lapin::Error::from(lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed))
}
