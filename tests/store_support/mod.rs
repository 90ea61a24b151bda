//! Store-level tests' support: a fresh database per test, and a wait for a backend blocked on a
//! lock (the race tests hold a session's lock while a writer waits for it).
#![allow(dead_code)]
// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use aptix::store::Store;
use sqlx::PgPool;
use uuid::Uuid;

/// A fresh database's store, and its name for [`drop_database`].
pub async fn fresh_store() -> (Store, String) {
    let id = Uuid::new_v4().simple().to_string()[..12].to_owned();
    let url = format!("postgres://postgres@127.0.0.1:5432/aptix_t_{id}");
    Store::create_database(&url).await.unwrap();
    let store = Store::connect(&url, 4).unwrap();
    store.migrate().await.unwrap();
    (store, id)
}

pub async fn drop_database(store: Store, id: &str) {
    store.close().await;
    let admin = PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres").await.unwrap();
    sqlx::query(&format!("DROP DATABASE aptix_t_{id} WITH (FORCE)")).execute(&admin).await.unwrap();
}

/// Waits until `n` backends of the database wait for a lock.
pub async fn lock_waiters(pool: &PgPool, n: i64) {
    let start = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{waiting} of {n} waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `session`'s lock, taken in a transaction of its own as a writer of its turns takes it.
pub async fn hold_lock(pool: &PgPool, session: Uuid) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(session)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}
