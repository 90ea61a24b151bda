//! Turns held over their tenant's limits (`over_limit = "queue"`, docs/tenancy.md) start when a
//! turn of the tenant ends (persist starts them in the same transaction) or when a per-minute
//! window frees room, which no message announces: this loop asks PostgreSQL for the latter
//! twice a second, in every process that runs the ingress stage. The tenant's lock makes the
//! loops of many processes decide as one.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::RuntimeSettings;
use crate::config::OverLimit;
use crate::stage::{timed, Route};
use crate::stages::Deps;

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
    let store = deps.store.clone();
    let gates = Arc::new(gates);
    let parts = (store.clone(), route, settings);
    timed::every(EVERY, parts, "held turn", shutdown, |tick| {
        let (store, gates) = (store.clone(), gates.clone());
        async move {
            if tick.is_multiple_of(20) {
                store.orphaned_starts(ORPHANED).await
            } else {
                store.start_held_turns(&gates).await
            }
        }
    })
    .await;
}
