//! Two copies of one user turn admitted at once (a redelivery racing its original). Admission
//! asks whether the turn is known in the statement that locks its session, whose snapshot is
//! taken before the lock is granted; the copy that waited for the lock cannot see the turn the
//! other committed meanwhile. The turns' key must catch it: the copy is refused as
//! `AdmittedMeanwhile`, nothing of it is written, and admitting it again finds the turn.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use aptix::contracts::{SessionId, TurnKey};
use aptix::store::{Admission, SessionMeta, Store, StoreError};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

fn key(session: Uuid, turn: &str) -> TurnKey {
    TurnKey { session_id: SessionId::new(session), turn_id: turn.parse().unwrap() }
}

async fn admit(store: &Store, session: Uuid, turn: &str) -> Result<Admission, StoreError> {
    let request = json!({"SessionId": session, "TurnId": turn, "Instruction": "hello"});
    let meta = SessionMeta::default();
    store.admit_user_turn(&key(session, turn), "fp", &request, &meta, None).await
}

/// Waits until `n` backends of the database wait for a lock.
async fn lock_waiters(pool: &PgPool, n: i64) {
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

#[tokio::test]
async fn a_copy_admitted_while_the_lock_was_awaited_is_caught_by_the_turns_key() {
    let id = Uuid::new_v4().simple().to_string()[..12].to_owned();
    let url = format!("postgres://postgres@127.0.0.1:5432/aptix_t_{id}");
    Store::create_database(&url).await.unwrap();
    let store = Store::connect(&url, 4).unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    let session = Uuid::now_v7();
    let first = admit(&store, session, "t0").await.unwrap();
    assert!(matches!(first, Admission::Accepted { queued: false, .. }), "{first:?}");

    // Hold the session's lock while both copies of t1 ask for it.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(session)
        .execute(&mut *holder)
        .await
        .unwrap();
    let (a, b) = (store.clone(), store.clone());
    let copy_a = tokio::spawn(async move { admit(&a, session, "t1").await });
    let copy_b = tokio::spawn(async move { admit(&b, session, "t1").await });
    lock_waiters(&pool, 2).await;
    holder.commit().await.unwrap();

    let results = [copy_a.await.unwrap(), copy_b.await.unwrap()];
    let accepted = results.iter().filter(|r| matches!(r, Ok(Admission::Accepted { .. }))).count();
    let caught = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::AdmittedMeanwhile { turn }) if turn == "t1"))
        .count();
    assert_eq!((accepted, caught), (1, 1), "{results:?}");
    assert!(results.iter().all(|r| r.as_ref().err().is_none_or(StoreError::is_transient)));

    // Admitted once: one row, queued behind t0, the session's sequence moved once.
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT turn_id, state, seq FROM turns WHERE session_id = $1 ORDER BY seq")
            .bind(session)
            .fetch_all(&pool)
            .await
            .unwrap();
    let states: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(states, [("t0", "running"), ("t1", "queued")]);
    let next_seq: i64 = sqlx::query_scalar("SELECT next_seq FROM sessions WHERE id = $1")
        .bind(session)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next_seq, rows[1].2 + 1);
    // Admitting the caught copy again finds the turn.
    let again = admit(&store, session, "t1").await.unwrap();
    assert!(matches!(again, Admission::InFlight { .. }), "{again:?}");

    store.close().await;
    let admin = PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres").await.unwrap();
    sqlx::query(&format!("DROP DATABASE aptix_t_{id} WITH (FORCE)")).execute(&admin).await.unwrap();
}
