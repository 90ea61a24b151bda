//! Which provider calls of this process their clients cancelled: one query for every call in
//! flight, every [`POLL`] while there are any, so an admitted cancel aborts its call within
//! that time on whichever invoke worker holds it. PostgreSQL holds the cancel, so a worker that
//! starts later (a redelivery) sees it too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::contracts::TurnKey;
use crate::store::Store;

/// How often the calls in flight are checked: well inside the second a cancel may take.
const POLL: Duration = Duration::from_millis(200);

/// The calls this process has in flight, each with the token its cancel fires.
#[derive(Debug)]
pub(super) struct CancelWatch {
    store: Store,
    calls: Mutex<HashMap<TurnKey, (CancellationToken, usize)>>,
    started: std::sync::Once,
}

/// A call being watched; it stops being watched when this is dropped.
pub(super) struct Watched {
    watch: Arc<CancelWatch>,
    key: TurnKey,
    /// Fires when the turn's cancel is seen.
    pub token: CancellationToken,
}

impl CancelWatch {
    pub(super) fn new(store: Store) -> Arc<Self> {
        Arc::new(CancelWatch { store, calls: Mutex::default(), started: std::sync::Once::new() })
    }

    /// Watches turn `key` until the returned guard is dropped. Register before reading whether
    /// the turn was cancelled: a cancel committed after that read is then seen by the poll.
    pub(super) fn watch(self: &Arc<Self>, key: &TurnKey) -> Watched {
        self.started.call_once(|| {
            tokio::spawn(poll(Arc::downgrade(self)));
        });
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let entry = calls.entry(key.clone()).or_insert_with(|| (CancellationToken::new(), 0));
        entry.1 += 1;
        Watched { watch: self.clone(), key: key.clone(), token: entry.0.clone() }
    }

    fn keys(&self) -> Vec<TurnKey> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    fn cancel(&self, key: &TurnKey) {
        if let Some((token, _)) = self.calls.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            token.cancel();
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut calls = self.watch.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = calls.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                calls.remove(&self.key);
            }
        }
    }
}

/// Polls while the stage exists.
async fn poll(watch: Weak<CancelWatch>) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(watch) = watch.upgrade() else { return };
        let keys = watch.keys();
        if keys.is_empty() {
            continue;
        }
        match watch.store.cancel_requested(&keys).await {
            Ok(cancelled) => cancelled.iter().for_each(|k| watch.cancel(k)),
            // The next poll tries again; a cancel missed meanwhile still ends the turn at persist.
            Err(error) => debug!(%error, "could not check calls for cancels"),
        }
    }
}
