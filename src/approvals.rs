//! Approval requests expire (`server_tools.approval_expiry_seconds`, docs/tools.md
//! "Approvals"): no message announces it, so this loop asks PostgreSQL once a second, in every
//! process that runs the ingress stage, and publishes the start of each turn whose calls it
//! denied. The session's lock makes the loops of many processes (and a late decision) decide as
//! one; a start left unpublished by a process that stopped is published again after 30 s.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::RuntimeSettings;
use crate::stage::{timed, Route};
use crate::stages::Deps;

/// How often the loop looks.
const EVERY: Duration = Duration::from_secs(1);
/// How long a start may stay unpublished before it is published again.
const ORPHANED: Duration = Duration::from_secs(30);

/// Runs until `shutdown`, whether or not this process's contexts gate a tool: a turn asked under
/// another configuration (one since changed, or another process's) must still expire.
pub async fn run(
    deps: Arc<Deps>,
    route: Route,
    settings: RuntimeSettings,
    shutdown: CancellationToken,
) {
    let store = deps.store.clone();
    let parts = (store.clone(), route, settings);
    timed::every(EVERY, parts, "expired approval", shutdown, |tick| {
        let store = store.clone();
        async move {
            if tick.is_multiple_of(15) {
                store.orphaned_expiries(ORPHANED).await
            } else {
                store.expire_approvals().await
            }
        }
    })
    .await;
}
