//! Turns held over their tenant's limits (`over_limit = "queue"`, docs/tenancy.md) start when a
//! turn of the tenant ends (persist starts them in the same transaction) or when a per-minute
//! window frees room, which no message announces: this loop asks PostgreSQL for the latter
//! twice a second, in every process that runs the ingress stage. The tenant's lock makes the
//! loops of many processes decide as one.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::broker::{LazyPublisher, RuntimeSettings};
use crate::config::OverLimit;
use crate::stage::Route;
use crate::stages::Deps;
use crate::store::PendingOutbox;

/// How often the loop looks.
const EVERY: Duration = Duration::from_millis(500);
/// How long a held turn's start message may stay unpublished before it is published again.
const ORPHANED: Duration = Duration::from_secs(30);

/// Runs until `shutdown`; returns at once when no tenant queues turns over its limits.
pub async fn run(
    deps: Arc<Deps>,
    route: Route,
    settings: RuntimeSettings,
    shutdown: CancellationToken,
) {
    let gates: Vec<_> = deps
        .store
        .gates()
        .into_iter()
        .filter(|g| g.limits.over_limit == OverLimit::Queue)
        .collect();
    if gates.is_empty() {
        return;
    }
    let publisher = LazyPublisher::new(settings);
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        ticks = ticks.wrapping_add(1);
        let found = if ticks.is_multiple_of(20) {
            deps.store.orphaned_starts(ORPHANED).await
        } else {
            deps.store.start_held_turns(&gates).await
        };
        match found {
            Ok(out) if !out.is_empty() => publish(&deps, &route, &publisher, out).await,
            Ok(_) => {}
            Err(error) => warn!(%error, "could not start held turns"),
        }
    }
}

/// Publishes started turns' messages, then deletes their outbox rows; what fails stays in the
/// outbox for the orphan pass.
async fn publish(deps: &Deps, route: &Route, publisher: &LazyPublisher, out: PendingOutbox) {
    debug!(turns = out.ids.len(), "starting held turns");
    for m in out.messages {
        let published: Result<_, crate::broker::BoxError> = match route.outgoing(m) {
            Ok(msg) => publisher.publish(msg).await.map_err(Into::into),
            Err(e) => Err(e.into()),
        };
        if let Err(error) = published {
            warn!(%error, "a held turn's start was not published; it is tried again later");
            return;
        }
    }
    if let Err(error) = deps.store.delete_outbox(&out.ids).await {
        warn!(%error, "published outbox rows not deleted; they are published again later");
    }
}
