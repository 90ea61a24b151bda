//! This process's liveness as PostgreSQL sees it: a session-level advisory lock on a key of the
//! process's own, held on a connection of its own while the process runs. Invoke's claims name
//! the key (`llm_claims.holder`), so a copy of a message tells a holder that died (its
//! connection closed with it and PostgreSQL let go of the lock at once) from one still calling,
//! instead of waiting out the holder's lease (migration 0037).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use sqlx::PgPool;
use tracing::warn;

/// How often the lock's connection is checked.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The pause before the lock is taken again after its connection was lost.
const RETAKE_AFTER: Duration = Duration::from_secs(1);

/// The key, whether the lock is held now, and the task that holds it (started on first use).
#[derive(Debug, Clone)]
pub(super) struct Liveness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    key: i64,
    held: AtomicBool,
    started: Once,
}

impl Liveness {
    pub(super) fn new() -> Liveness {
        let key = uuid::Uuid::new_v4().as_u64_pair().0 as i64;
        Liveness {
            inner: Arc::new(Inner { key, held: AtomicBool::new(false), started: Once::new() }),
        }
    }

    /// The key, when this process holds its lock now; the first call starts holding it (in
    /// the background: that call gets `None`).
    pub(super) fn key(&self, pool: &PgPool) -> Option<i64> {
        self.inner.started.call_once(|| {
            tokio::spawn(hold(pool.clone(), self.inner.clone()));
        });
        self.inner.held.load(Ordering::Acquire).then_some(self.inner.key)
    }
}

/// Holds the lock for as long as the runtime runs, taking it again on a new connection when
/// its connection is lost (the database restarted, a failover).
async fn hold(pool: PgPool, inner: Arc<Inner>) {
    let mut said = false;
    loop {
        match lock(&pool, inner.key).await {
            Ok(mut conn) => {
                inner.held.store(true, Ordering::Release);
                said = false;
                while ping(&mut conn).await.is_ok() {
                    tokio::time::sleep(CHECK_EVERY).await;
                }
                inner.held.store(false, Ordering::Release);
            }
            // The store was closed: the process is ending.
            Err(sqlx::Error::PoolClosed) => return,
            Err(error) if !said => {
                warn!(%error, "process liveness lock not taken; claims rely on their leases");
                said = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(RETAKE_AFTER).await;
    }
}

/// A connection out of the pool (its slot freed), holding the lock.
async fn lock(pool: &PgPool, key: i64) -> Result<sqlx::PgConnection, sqlx::Error> {
    let mut conn = pool.acquire().await?.detach();
    let locked = sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock($1) AS "locked!""#, key)
        .fetch_one(&mut conn)
        .await?;
    // Another process drew the same random key: not this process's to claim by.
    match locked {
        true => Ok(conn),
        false => Err(sqlx::Error::Protocol("the liveness key is held by another process".into())),
    }
}

async fn ping(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query!("SELECT 1 AS alive").fetch_one(conn).await.map(drop)
}
