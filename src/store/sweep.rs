//! Deleting published outbox rows, coalesced: deletes asked for while one is running go out
//! together in the next single statement, so a busy process commits one delete for many turns
//! instead of one per confirmed message. No delete waits for a batch to fill: an idle process
//! deletes at once, as before.
//!
//! Nothing acks later for it: a message is acked once its outputs are confirmed, and the rows'
//! deletion follows in the background (a crash before it only republishes what consumers
//! already drop by message id).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::{Store, StoreError};

/// How one batch's delete ended, told to each caller in it.
type Done = oneshot::Sender<Result<(), Arc<StoreError>>>;

/// Rows waiting to be deleted, and whether a drain is running.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    waiting: Vec<(Vec<i64>, Done)>,
    running: bool,
}

/// The sweep of one store (shared by its clones), with a pool of one connection used by nothing
/// else, so a delete never queues behind the stages' statements.
#[derive(Debug, Clone)]
pub(super) struct Sweeper {
    state: Arc<Mutex<Sweep>>,
    pool: sqlx::PgPool,
}

impl Sweeper {
    pub(super) fn new(pool: sqlx::PgPool) -> Self {
        Sweeper { state: Arc::default(), pool }
    }

    pub(super) async fn close(&self) {
        self.pool.close().await;
    }
}

impl Store {
    /// Deletes published outbox rows, in one statement with any other rows whose deletion was
    /// asked for meanwhile.
    pub async fn delete_outbox(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut sweep = self.sweep.state.lock().unwrap_or_else(PoisonError::into_inner);
            sweep.waiting.push((ids.to_vec(), tx));
            !std::mem::replace(&mut sweep.running, true)
        };
        if start {
            tokio::spawn(self.clone().drain());
        }
        match rx.await {
            Ok(result) => result.map_err(StoreError::Shared),
            Err(_) => Err(StoreError::Shared(Arc::new(StoreError::Db(sqlx::Error::PoolClosed)))),
        }
    }

    /// Deletes what is waiting, batch after batch, until nothing is.
    async fn drain(self) {
        loop {
            let batch = {
                let mut sweep = self.sweep.state.lock().unwrap_or_else(PoisonError::into_inner);
                if sweep.waiting.is_empty() {
                    sweep.running = false;
                    return;
                }
                std::mem::take(&mut sweep.waiting)
            };
            let ids: Vec<i64> = batch.iter().flat_map(|(ids, _)| ids.iter().copied()).collect();
            // Planned with these ids each time: the connection forces custom plans (Store::connect).
            let result = sqlx::query!("DELETE FROM outbox WHERE id = ANY($1)", &ids)
                .execute(&self.sweep.pool)
                .await
                .map(drop)
                .map_err(|e| Arc::new(StoreError::Db(e)));
            for (_, done) in batch {
                let _ = done.send(result.clone());
            }
        }
    }
}
