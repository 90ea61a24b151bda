//! Delivers parked replies: replies a client's queue refused (docs/reliability.md, "Client-owned
//! queues") wait in PostgreSQL, and this loop offers each to its queue again, oldest first per
//! queue, backing off while the queue keeps refusing. It runs in every process that runs a
//! stage; PostgreSQL's row claims make the loops of many processes deliver each reply once.
//! A reply that waited longer than a session queue lives unused is kept in `<prefix>.unrouted`.
//! The heads of a batch (one per queue) are offered at once, each tenant's in turn, so queues
//! whose confirms never come (their node down) cost a batch one wait, not one each, and hold
//! back neither other tenants' replies nor the refresh of the waiting list.

use std::time::Duration;

use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::broker::{keep_unrouted, Handed, LazyPublisher, OutMessage, Publisher, RuntimeSettings};
use crate::store::{Parked, Store};

/// How often the loop looks for due replies.
const EVERY: Duration = Duration::from_millis(500);
/// Queues with waiting replies this process learns of at once (past it, a new reply to one of
/// the others is offered to its queue first and parked when refused).
const WAITING_LIMIT: i64 = 100_000;
/// Replies claimed at once.
const BATCH: i64 = 64;
/// How long a pass goes on claiming due replies before the waiting list is read again (it
/// claims one batch at least).
const PASS: Duration = Duration::from_secs(1);
/// Offers made at once (each may wait for its queue's confirm): a bound on the publishes and
/// the database statements the loop adds to its process's.
const OFFERS_AT_ONCE: usize = 16;
/// How long one offer may take, its confirm and its row's update included; past it the reply
/// is offered again later (a copy, if the first went after all, is dropped by message id).
const OFFER_LIMIT: Duration = Duration::from_secs(10);
/// How long a reply waits for its queue before it is kept in `<prefix>.unrouted` instead: the
/// unused lifetime of a session queue under the shipped policy.
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// Runs until `shutdown`.
pub async fn run(store: Store, settings: RuntimeSettings, shutdown: CancellationToken) {
    let publisher = LazyPublisher::new(settings.clone());
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(EVERY) => {}
        }
        // New replies to a queue with replies waiting park behind them, in every process.
        let read_at = std::time::Instant::now();
        match store.parked_queues(WAITING_LIMIT).await {
            Ok(queues) => crate::broker::set_waiting_queues(queues.into_iter().collect(), read_at),
            Err(error) => debug!(%error, "parked queues not read"),
        }
        // What is due, batch after batch (a queue that came back gets its replies at once), for
        // a second at most: the waiting list is read again at least that often.
        let pass = std::time::Instant::now();
        loop {
            let claimed = match store.claim_parked(BATCH).await {
                Ok(claimed) if claimed.is_empty() => break,
                Ok(claimed) => claimed,
                Err(error) => {
                    debug!(%error, "parked replies not read");
                    break;
                }
            };
            // Unreachable, the claimed replies are offered again once their claim runs out.
            let p = match publisher.publisher().await {
                Ok(p) => p,
                Err(error) => {
                    debug!(%error, "parked replies wait for the broker");
                    break;
                }
            };
            // One head per queue: offering them together keeps each queue's order.
            let offers = claimed.into_iter().map(|parked| bounded(&store, &p, &settings, parked));
            futures_util::stream::iter(offers)
                .buffer_unordered(OFFERS_AT_ONCE)
                .collect::<Vec<()>>()
                .await;
            if shutdown.is_cancelled() || pass.elapsed() >= PASS {
                break;
            }
        }
    }
    publisher.close(Duration::from_secs(2)).await;
}

/// [`offer`], for [`OFFER_LIMIT`] at most: then the reply is due again after a back-off.
async fn bounded(store: &Store, publisher: &Publisher, settings: &RuntimeSettings, p: Parked) {
    let (id, tries) = (p.id, p.tries);
    if tokio::time::timeout(OFFER_LIMIT, offer(store, publisher, settings, p)).await.is_err() {
        debug!(id, "parked reply's offer took too long; offered again later");
        let _ = store.park_again(id, backoff(tries)).await;
    }
}

/// Offers one parked reply to its queue again.
async fn offer(store: &Store, publisher: &Publisher, settings: &RuntimeSettings, p: Parked) {
    let topology = &settings.topology;
    let message: OutMessage = match serde_json::from_value(p.message) {
        Ok(m) => m,
        Err(error) => {
            // Written by this module's writer; unreadable means a newer version wrote it.
            warn!(id = p.id, queue = %p.queue, %error, "parked reply unreadable, left for a newer worker");
            let _ = store.park_again(p.id, KEEP).await;
            return;
        }
    };
    let handed = if p.age > KEEP {
        keep_unrouted(publisher, topology, &message, "waited a day for its queue").await
    } else {
        publisher.deliver_parked(topology, &message).await
    };
    let settled = match handed {
        Ok(Handed::Done) => {
            info!(queue = %p.queue, message_id = %message.message_id, tries = p.tries + 1, "parked reply delivered");
            crate::metrics::metrics().message("reply", "parked_delivered");
            store.unpark(p.id).await
        }
        Ok(Handed::Refused(reason)) => {
            debug!(queue = %p.queue, %reason, "parked reply refused again");
            store.park_again(p.id, backoff(p.tries)).await
        }
        Err(error) => {
            debug!(queue = %p.queue, %error, "parked reply not offered");
            store.park_again(p.id, backoff(0)).await
        }
    };
    if let Err(error) = settled {
        // The claim runs out and the reply is offered again: a copy, dropped by message id.
        debug!(id = p.id, %error, "parked reply's row not updated");
    }
}

/// The wait before the next offer of a reply refused `tries` times before.
fn backoff(tries: i32) -> Duration {
    // Capped low: a queue that came back waits at most this long for its replies, and later
    // replies to it park behind them meanwhile.
    const STEPS_MS: [u64; 5] = [500, 1_000, 2_000, 5_000, 10_000];
    let i = usize::try_from(tries).unwrap_or(0).min(STEPS_MS.len() - 1);
    Duration::from_millis(STEPS_MS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_back_off_to_ten_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_secs(5));
        assert_eq!(backoff(99), Duration::from_secs(10));
        assert_eq!(backoff(-1), Duration::from_millis(500));
    }
}
