//! Moving the ingress from one partition layout to another (`aptix repartition`): unbinding the
//! old layout from the entry exchange, reading its depth, and deleting it once drained.

use super::{BrokerError, Publisher, Topology};
use lapin::options::{
    ExchangeDeleteOptions, ExchangeUnbindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;

impl Topology {
    /// Stops the entry exchange from routing to the ingress layout of `partitions` partitions.
    /// Requests already in it stay there.
    pub async fn unbind_ingress_of(
        &self,
        publisher: &Publisher,
        partitions: u16,
    ) -> Result<(), BrokerError> {
        let ch = publisher.scratch_channel().await?;
        let entry = self.requests_exchange();
        if partitions <= 1 {
            let queue = self.requests();
            let none = FieldTable::default();
            ch.queue_unbind(queue.as_str().into(), entry.as_str().into(), "#".into(), none).await?;
        } else {
            let hash = self.partition_exchange(partitions);
            ch.exchange_unbind(
                hash.as_str().into(),
                entry.as_str().into(),
                "#".into(),
                ExchangeUnbindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        }
        let _ = ch.close(200, "unbound".into()).await;
        Ok(())
    }

    /// Requests waiting in the ingress layout of `partitions` partitions (not counting those
    /// delivered and not yet acknowledged); queues that do not exist count as empty.
    pub async fn ingress_depth_of(
        &self,
        publisher: &Publisher,
        partitions: u16,
    ) -> Result<u64, BrokerError> {
        let mut total = 0;
        for queue in self.ingress_queues_of(partitions) {
            if let Some((ready, _)) = passive_counts(publisher, &queue).await? {
                total += u64::from(ready);
            }
        }
        Ok(total)
    }

    /// How many queues of the ingress layout of `partitions` partitions exist, and how many
    /// consumers they have together.
    pub async fn ingress_presence_of(
        &self,
        publisher: &Publisher,
        partitions: u16,
    ) -> Result<(usize, u32), BrokerError> {
        let (mut found, mut consumers) = (0, 0);
        for queue in self.ingress_queues_of(partitions) {
            if let Some((_, c)) = passive_counts(publisher, &queue).await? {
                found += 1;
                consumers += c;
            }
        }
        Ok((found, consumers))
    }

    /// Deletes the ingress layout of `partitions` partitions: its queues if empty and unused,
    /// and its hash exchange. Returns how many queues were deleted.
    pub async fn delete_ingress_of(
        &self,
        publisher: &Publisher,
        partitions: u16,
    ) -> Result<usize, BrokerError> {
        let mut deleted = 0;
        for queue in self.ingress_queues_of(partitions) {
            let ch = publisher.scratch_channel().await?;
            let options = QueueDeleteOptions { if_unused: true, if_empty: true, nowait: false };
            match ch.queue_delete(queue.as_str().into(), options).await {
                Ok(_) => {
                    deleted += 1;
                    let _ = ch.close(200, "deleted".into()).await;
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if partitions > 1 {
            let ch = publisher.scratch_channel().await?;
            let hash = self.partition_exchange(partitions);
            let _ =
                ch.exchange_delete(hash.as_str().into(), ExchangeDeleteOptions::default()).await;
            let _ = ch.close(200, "deleted".into()).await;
        }
        Ok(deleted)
    }
}

/// A queue's messages ready and consumers, read with a passive declare (which creates
/// nothing); `None` when the queue does not exist.
pub(super) async fn passive_counts(
    publisher: &Publisher,
    queue: &str,
) -> Result<Option<(u32, u32)>, BrokerError> {
    // A passive declare of a missing queue closes its channel: one channel per queue.
    let ch = publisher.scratch_channel().await?;
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    match ch.queue_declare(queue.into(), passive, FieldTable::default()).await {
        Ok(q) => {
            let _ = ch.close(200, "counted".into()).await;
            Ok(Some((q.message_count(), q.consumer_count())))
        }
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the broker said the queue (or exchange) does not exist.
pub(super) fn is_not_found(e: &lapin::Error) -> bool {
    e.to_string().contains("NOT_FOUND") || e.to_string().contains("404")
}
