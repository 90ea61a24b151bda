//! The outbox sweep's delete stays an index lookup as the table fills with dead rows. Prepared
//! once per connection, it kept the generic plan PostgreSQL made while the table was nearly
//! empty, a sequential scan, and read every page of dead rows on each later delete (278 pages
//! a delete a minute into a fresh database at the ceiling; docs/bench/history.md, "Ninth pass").
//! The table's own scan counter tells which plan ran, read after the deleting connection has
//! reported its statistics.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use aptix::store::Store;
use sqlx::PgPool;

/// Sequential scans and deleted rows of `outbox`, as the statistics system has them.
async fn outbox_stats(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT seq_scan, n_tup_del FROM pg_stat_user_tables WHERE relname = 'outbox'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The scan count once every backend has reported `deleted` rows deleted: a backend reports its
/// counters together, at most a few seconds after it goes idle.
async fn seq_scans_after(pool: &PgPool, deleted: i64) -> i64 {
    let start = Instant::now();
    loop {
        let (scans, dels) = outbox_stats(pool).await;
        if dels >= deleted {
            assert_eq!(dels, deleted, "more rows deleted than the test deleted");
            return scans;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "statistics not reported: {dels}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rows as the stages write them (a typed payload), returning their ids.
async fn insert_rows(pool: &PgPool, n: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "INSERT INTO outbox (session_id, turn_id, payload)
         SELECT gen_random_uuid(), 't-' || i, '{\"kind\": \"start\", \"v\": 1}'::jsonb
         FROM generate_series(1, $1) AS i RETURNING id",
    )
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_sweep_finds_its_rows_by_index_after_the_table_has_grown() {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let url = format!("postgres://postgres@127.0.0.1:5432/aptix_t_{id}");
    Store::create_database(&url).await.unwrap();
    let store = Store::connect(&url, 2).unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();

    // The first batches meet an empty table, as in a fresh deployment: more than the five
    // executions after which PostgreSQL may settle on a generic plan.
    let mut deleted = 0;
    for _ in 0..8 {
        let ids = insert_rows(&pool, 5).await;
        store.delete_outbox(&ids).await.unwrap();
        deleted += 5;
    }
    // Then the table grows: 20,000 rows published and deleted, not yet vacuumed.
    let ids = insert_rows(&pool, 20_000).await;
    for chunk in ids.chunks(1_000) {
        sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
            .bind(chunk)
            .persistent(false)
            .execute(&pool)
            .await
            .unwrap();
    }
    deleted += 20_000;
    let pages: i64 = sqlx::query_scalar("SELECT pg_relation_size('outbox') / 8192")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(pages > 100, "the table should hold many pages of dead rows: {pages}");
    let before = seq_scans_after(&pool, deleted).await;

    let ids = insert_rows(&pool, 5).await;
    store.delete_outbox(&ids).await.unwrap();
    let after = seq_scans_after(&pool, deleted + 5).await;
    assert_eq!(after, before, "the sweep's delete scanned all {pages} pages of the outbox");
    assert_eq!(store.outbox_len().await.unwrap(), 0);

    store.close().await;
    let admin = PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres").await.unwrap();
    sqlx::query(&format!("DROP DATABASE aptix_t_{id} WITH (FORCE)")).execute(&admin).await.unwrap();
}
