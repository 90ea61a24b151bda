//! This process's liveness as PostgreSQL sees it: a session-level advisory lock on a key of the
//! process's own, held on a connection of its own while the process runs. Invoke's claims name
//! the key (`llm_claims.holder`), so a copy of a message tells a holder that died (its
//! connection closed with it and PostgreSQL let go of the lock at once) from one still calling,
//! instead of waiting out the holder's whole lease (migration 0037).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use sqlx::PgPool;
use tracing::warn;

/// How often the lock's connection is checked, and how long a check may take.
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
    key: AtomicI64,
    held: AtomicBool,
    started: Once,
}

impl Liveness {
    pub(super) fn new() -> Liveness {
        let inner =
            Inner { key: AtomicI64::new(new_key()), held: false.into(), started: Once::new() };
        Liveness { inner: Arc::new(inner) }
    }

    /// The key, when this process holds its lock now; the first call in a runtime starts
    /// holding it (in the background: that call gets `None`, as every call outside a runtime).
    pub(super) fn key(&self, pool: &PgPool) -> Option<i64> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return None };
        self.inner.started.call_once(|| {
            runtime.spawn(hold(pool.clone(), self.inner.clone()));
        });
        let held = self.inner.held.load(Ordering::Acquire);
        held.then(|| self.inner.key.load(Ordering::Acquire))
    }
}

fn new_key() -> i64 {
    uuid::Uuid::new_v4().as_u64_pair().0 as i64
}

/// Holds the lock until the store is closed, taking it again on a new connection when its
/// connection is lost (the database restarted, a failover). A connection that answers from
/// another server session (a transaction-mode pooler) cannot hold it: claims then rely on their
/// leases alone.
async fn hold(pool: PgPool, inner: Arc<Inner>) {
    let mut said = false;
    loop {
        let key = inner.key.load(Ordering::Acquire);
        match lock(&pool, key).await {
            Ok((mut conn, pid)) => {
                inner.held.store(true, Ordering::Release);
                said = false;
                let lost = loop {
                    tokio::time::sleep(CHECK_EVERY).await;
                    match tokio::time::timeout(CHECK_EVERY, backend(&mut conn)).await {
                        Ok(Ok(now)) if now == pid => {}
                        Ok(Ok(_)) => break Some("its connection answers from another session"),
                        _ => break None,
                    }
                };
                inner.held.store(false, Ordering::Release);
                if let Some(why) = lost {
                    warn!(why, "process liveness lock cannot be held (a transaction-mode pooler?); claims rely on their leases");
                    return;
                }
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(error) => {
                if !said {
                    warn!(%error, "process liveness lock not taken; claims rely on their leases");
                    said = true;
                }
                // A key another process holds (drawn alike, or this one's old session not yet
                // gone): another key.
                inner.key.store(new_key(), Ordering::Release);
            }
        }
        tokio::time::sleep(RETAKE_AFTER).await;
    }
}

/// A connection out of the pool (its slot freed) holding the lock, and its server session.
async fn lock(pool: &PgPool, key: i64) -> Result<(sqlx::PgConnection, i32), sqlx::Error> {
    let mut conn = pool.acquire().await?.detach();
    let row = sqlx::query!(
        r#"SELECT pg_try_advisory_lock($1) AS "locked!", pg_backend_pid() AS "pid!""#,
        key
    )
    .fetch_one(&mut conn)
    .await?;
    match row.locked {
        true => Ok((conn, row.pid)),
        false => Err(sqlx::Error::Protocol("the liveness key is held by another session".into())),
    }
}

/// The server session `conn` answers from.
async fn backend(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(conn).await
}
