//! Work that time starts, not a message: a loop that asks the store, at a fixed period, for
//! turns to start (held turns a window freed, approval requests that expired) and publishes
//! their start messages, then deletes their outbox rows. What fails to publish stays in the
//! outbox for the caller's orphan pass.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Route;
use crate::broker::{BoxError, LazyPublisher, RuntimeSettings};
use crate::store::{PendingOutbox, Store, StoreError};

/// Calls `find` every `period` (with the tick's number) until `shutdown`, publishing what it
/// returns; `what` names the work in logs.
pub async fn every<F, Fut>(
    period: Duration,
    (store, route, settings): (Store, Route, RuntimeSettings),
    what: &'static str,
    shutdown: CancellationToken,
    mut find: F,
) where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<PendingOutbox, StoreError>>,
{
    let publisher = LazyPublisher::new(settings);
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        ticks = ticks.wrapping_add(1);
        match find(ticks).await {
            Ok(out) if !out.is_empty() => publish(&store, &route, &publisher, out, what).await,
            Ok(_) => {}
            Err(error) => warn!(%error, what, "could not look for turns to start"),
        }
    }
}

/// Publishes started turns' messages, then deletes the outbox rows of those published. One
/// that fails stays for a later pass and holds back none of the others.
async fn publish(
    store: &Store,
    route: &Route,
    publisher: &LazyPublisher,
    out: PendingOutbox,
    what: &'static str,
) {
    debug!(turns = out.ids.len(), what, "starting turns");
    let mut published_ids = Vec::with_capacity(out.ids.len());
    for (id, m) in out.ids.into_iter().zip(out.messages) {
        let published: Result<_, BoxError> = match route.outgoing(m) {
            Ok(msg) => publisher.publish(msg).await.map_err(Into::into),
            Err(e) => Err(e.into()),
        };
        match published {
            Ok(()) => published_ids.push(id),
            Err(error) => {
                warn!(outbox_id = id, %error, what, "a start was not published; it is tried again later")
            }
        }
    }
    if let Err(error) = store.delete_outbox(&published_ids).await {
        warn!(%error, "published outbox rows not deleted; they are published again later");
    }
}
