//! Delivers parked replies: replies a client's queue refused (docs/reliability.md, "Client-owned
//! queues") wait in PostgreSQL, and this loop offers each to its queue again, oldest first per
//! queue, backing off while the queue keeps refusing. It runs in every process that runs a
//! stage; PostgreSQL's row claims make the loops of many processes deliver each reply once.
//! A reply that waited longer than a session queue lives unused is kept in `<prefix>.unrouted`,
//! and so is one no worker could read for as long.
//! Offers run side by side, each queue's head claimed when a place frees (not batch after
//! batch: one queue whose confirms never come held a whole batch back, and the batch's last
//! offers outlived their claims), at most [`PER_TENANT`] of a tenant's at once, so queues of
//! one tenant that never confirm hold back neither another tenant's replies nor the refresh of
//! the waiting list, which runs on a clock of its own.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt as _;
use serde::Deserialize as _;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::broker::{keep_unrouted, Handed, LazyPublisher, OutMessage, Publisher, RuntimeSettings};
use crate::store::{Parked, Store};

/// How often the loop reads the waiting list and looks for due replies.
const EVERY: Duration = Duration::from_millis(500);
/// Queues with waiting replies this process learns of at once (past it, a new reply to one of
/// the others is offered to its queue first and parked when refused).
const WAITING_LIMIT: i64 = 100_000;
/// Offers made at once (each may wait for its queue's confirm): a bound on the publishes and
/// the database statements the loop adds to its process's.
const OFFERS_AT_ONCE: usize = 16;
/// Offers of one tenant's replies made at once (a deployment without tenants: all of them).
const PER_TENANT: usize = 4;
/// How long one offer may take, its confirm and its row's update included; past it the reply
/// is offered again later (a copy, if the first went after all, is dropped by message id).
const OFFER_LIMIT: Duration = Duration::from_secs(10);
/// How long a reply waits for its queue before it is kept in `<prefix>.unrouted` instead: the
/// unused lifetime of a session queue under the shipped policy.
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// Offers in flight, by tenant.
#[derive(Debug, Default)]
struct Places {
    by_tenant: HashMap<Option<String>, usize>,
    total: usize,
}

impl Places {
    fn free(&self) -> usize {
        OFFERS_AT_ONCE - self.total
    }

    /// Tenants with offers in flight, and how many (no tenant is never capped).
    fn busy(&self) -> Vec<(String, i64)> {
        let busy = self.by_tenant.iter().filter_map(|(t, n)| Some((t.clone()?, *n as i64)));
        busy.collect()
    }

    fn take(&mut self, tenant: &Option<String>) {
        *self.by_tenant.entry(tenant.clone()).or_default() += 1;
        self.total += 1;
    }

    fn give_back(&mut self, tenant: &Option<String>) {
        if let Some(n) = self.by_tenant.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.by_tenant.remove(tenant);
            }
        }
        self.total -= 1;
    }
}

/// Runs until `shutdown`; offers in flight then end (each within [`OFFER_LIMIT`]).
pub async fn run(store: Store, settings: RuntimeSettings, shutdown: CancellationToken) {
    let publisher = LazyPublisher::new(settings.clone());
    let mut places = Places::default();
    let mut offers = FuturesUnordered::new();
    let mut clock = tokio::time::interval(EVERY);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether due replies may be left (the last claim filled the places it was given).
    let mut more = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = clock.tick() => {
                refresh_waiting(&store).await;
                more = true;
            }
            Some(tenant) = offers.next(), if !offers.is_empty() => places.give_back(&tenant),
        }
        if !more || places.free() == 0 {
            continue;
        }
        let free = places.free();
        let busy = places.busy();
        let claimed = match store.claim_parked(free as i64, PER_TENANT as i64, &busy).await {
            Ok(claimed) => claimed,
            Err(error) => {
                debug!(%error, "parked replies not read");
                Vec::new()
            }
        };
        more = claimed.len() == free;
        if claimed.is_empty() {
            continue;
        }
        // Unreachable, the claimed replies are offered again once their claim runs out.
        let p = match publisher.publisher().await {
            Ok(p) => p,
            Err(error) => {
                debug!(%error, "parked replies wait for the broker");
                more = false;
                continue;
            }
        };
        for parked in claimed {
            places.take(&parked.tenant);
            let (store, settings, p) = (store.clone(), settings.clone(), p.clone());
            offers.push(async move {
                let tenant = parked.tenant.clone();
                bounded(&store, &p, &settings, parked).await;
                tenant
            });
        }
    }
    while offers.next().await.is_some() {}
    publisher.close(Duration::from_secs(2)).await;
}

/// Reads which queues have replies waiting: new replies to them, in every process, park behind.
async fn refresh_waiting(store: &Store) {
    let read_at = std::time::Instant::now();
    match store.parked_queues(WAITING_LIMIT).await {
        Ok(queues) => crate::broker::set_waiting_queues(queues.into_iter().collect(), read_at),
        Err(error) => debug!(%error, "parked queues not read"),
    }
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
    let message = match OutMessage::deserialize(&p.message) {
        Ok(m) => m,
        Err(error) => return unreadable(store, publisher, topology, p, &error).await,
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

/// A parked reply this version does not read. Unreadable means a newer version wrote it: it is
/// offered again as soon as a refused one, for a worker of that version to take, so the
/// queue's later replies wait behind it no longer than an upgrade lasts. One no version read
/// in a day is kept in `<prefix>.unrouted` as stored, its queue's later replies then going on.
async fn unreadable(
    store: &Store,
    publisher: &Publisher,
    topology: &crate::broker::Topology,
    p: Parked,
    error: &serde_json::Error,
) {
    if p.age <= KEEP {
        // Once per reply: offered again every few seconds, it would fill the log for a day.
        if p.tries == 0 {
            warn!(id = p.id, queue = %p.queue, %error, "parked reply unreadable, left for a newer worker");
        }
        let _ = store.park_again(p.id, backoff(p.tries)).await;
        return;
    }
    let message_id = p.message.get("message_id").and_then(|m| m.as_str()).unwrap_or_default();
    let stored = serde_json::to_vec(&p.message).unwrap_or_default();
    let mut raw = OutMessage::to_queue(p.queue.clone(), "parked", message_id.to_owned(), stored);
    raw.tenant = p.tenant.as_deref().and_then(|t| t.parse().ok());
    let reason = "unreadable for a day: kept as stored";
    match keep_unrouted(publisher, topology, &raw, reason).await {
        Ok(Handed::Done) => {
            error!(id = p.id, queue = %p.queue, %error, "parked reply no worker read in a day, kept in the unrouted queue as stored");
            let _ = store.unpark(p.id).await;
        }
        _ => {
            let _ = store.park_again(p.id, backoff(0)).await;
        }
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
    fn places_count_each_tenants_offers_and_no_tenant_is_never_capped() {
        let mut places = Places::default();
        let (a, b, none) = (Some("a".to_owned()), Some("b".to_owned()), None);
        for _ in 0..PER_TENANT {
            places.take(&a);
            places.take(&none);
        }
        places.take(&b);
        let mut busy = places.busy();
        busy.sort();
        assert_eq!(busy, [("a".to_owned(), PER_TENANT as i64), ("b".to_owned(), 1)]);
        assert_eq!(places.free(), OFFERS_AT_ONCE - 2 * PER_TENANT - 1);
        places.give_back(&a);
        places.give_back(&b);
        assert!(!places.by_tenant.contains_key(&b));
    }

    #[test]
    fn offers_back_off_to_ten_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_secs(5));
        assert_eq!(backoff(99), Duration::from_secs(10));
        assert_eq!(backoff(-1), Duration::from_millis(500));
    }
}
