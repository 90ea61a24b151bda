//! Admissions racing under a session's lock. Two copies of one user turn admitted at once (a
//! redelivery racing its original) while the session is busy: admission asks whether the turn is
//! known in the statement that locks its session, whose snapshot is taken before the lock is
//! granted; the copy that waited for the lock cannot see the turn the other committed meanwhile.
//! The turns' key must catch it: the copy is refused as `AdmittedMeanwhile`, nothing of it is
//! written, and admitting it again finds the turn. An idle session's turn is admitted in one
//! round trip (migration 0029's function), whose statements each see what the lock's last
//! holder committed: a copy, or a reply written meanwhile, is seen there.
#![allow(clippy::unwrap_used)]

use aptix::contracts::{SessionId, TurnKey};
use aptix::store::{Admission, SessionMeta, Store, StoreError};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::store_support::{drop_database, fresh_store, hold_lock, lock_waiters};

fn key(session: Uuid, turn: &str) -> TurnKey {
    TurnKey { session_id: SessionId::new(session), turn_id: turn.parse().unwrap() }
}

async fn admit(store: &Store, session: Uuid, turn: &str) -> Result<Admission, StoreError> {
    let request = json!({"SessionId": session, "TurnId": turn, "Instruction": "hello"});
    let meta = SessionMeta::default();
    store.admit_user_turn(&key(session, turn), "fp", &request, &meta, None).await
}

/// Turns of `session`: id, state and seq, in order.
async fn turns(pool: &PgPool, session: Uuid) -> Vec<(String, String, i64)> {
    sqlx::query_as("SELECT turn_id, state, seq FROM turns WHERE session_id = $1 ORDER BY seq")
        .bind(session)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A session whose first turn was admitted, published and ended, as persist leaves it: idle,
/// nothing in the outbox.
async fn idle_session(store: &Store) -> Uuid {
    let pool = store.pool();
    let session = Uuid::now_v7();
    let first = admit(store, session, "t0").await.unwrap();
    assert!(matches!(first, Admission::Accepted { queued: false, .. }), "{first:?}");
    for ended in [
        "DELETE FROM outbox WHERE session_id = $1",
        "UPDATE turns SET state = 'completed' WHERE session_id = $1",
        "UPDATE sessions SET active_turn_id = NULL WHERE id = $1",
    ] {
        sqlx::query(ended).bind(session).execute(pool).await.unwrap();
    }
    session
}

/// Two copies of turn t1 admitted while `session`'s lock is held, both waiting when it is
/// released.
async fn two_copies_behind_a_lock(
    store: &Store,
    session: Uuid,
) -> [Result<Admission, StoreError>; 2] {
    let pool = store.pool();
    let holder = hold_lock(pool, session).await;
    let (a, b) = (store.clone(), store.clone());
    let copy_a = tokio::spawn(async move { admit(&a, session, "t1").await });
    let copy_b = tokio::spawn(async move { admit(&b, session, "t1").await });
    lock_waiters(pool, 2).await;
    holder.commit().await.unwrap();
    [copy_a.await.unwrap(), copy_b.await.unwrap()]
}

async fn outbox_rows(pool: &PgPool, session: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE session_id = $1")
        .bind(session)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_idle_sessions_copies_admitted_at_once_see_each_other() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let session = idle_session(&store).await;

    let results = two_copies_behind_a_lock(&store, session).await;

    // The copy granted the lock second sees its twin's turn: a copy in flight, not a second
    // turn, and not `AdmittedMeanwhile` (its statements see what was committed before them).
    let results = results.map(Result::unwrap);
    let started =
        results.iter().filter(|r| matches!(r, Admission::Accepted { queued: false, .. })).count();
    let in_flight = results.iter().filter(|r| matches!(r, Admission::InFlight { .. })).count();
    assert_eq!((started, in_flight), (1, 1), "{results:?}");
    let rows = turns(&pool, session).await;
    let states: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(states, [("t0", "completed"), ("t1", "running")]);
    assert_eq!(outbox_rows(&pool, session).await, 1, "one start message");
    drop_database(store, &id).await;
}

#[tokio::test]
async fn a_reply_written_while_the_lock_was_awaited_is_not_overtaken() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let session = idle_session(&store).await;

    // The lock's holder writes the session's last reply to the outbox, as persist's commit
    // does; a snapshot taken before the lock was granted would miss it and start the turn ahead
    // of the reply.
    let mut holder = hold_lock(&pool, session).await;
    let s = store.clone();
    let next = tokio::spawn(async move { admit(&s, session, "t1").await });
    lock_waiters(&pool, 1).await;
    sqlx::query("INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, 't0', '{}')")
        .bind(session)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder.commit().await.unwrap();

    // The fresh reply is left to its writer; the admission is tried again later.
    let result = next.await.unwrap();
    assert!(matches!(result, Err(StoreError::ReplyInFlight)), "{result:?}");
    assert_eq!(turns(&pool, session).await.len(), 1, "nothing of t1 written");
    assert_eq!(outbox_rows(&pool, session).await, 1, "the reply alone");
    drop_database(store, &id).await;
}

#[tokio::test]
async fn a_copy_admitted_while_the_lock_was_awaited_is_caught_by_the_turns_key() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let session = Uuid::now_v7();
    let first = admit(&store, session, "t0").await.unwrap();
    assert!(matches!(first, Admission::Accepted { queued: false, .. }), "{first:?}");

    let results = two_copies_behind_a_lock(&store, session).await;

    let accepted = results.iter().filter(|r| matches!(r, Ok(Admission::Accepted { .. }))).count();
    let caught = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::AdmittedMeanwhile { turn }) if turn == "t1"))
        .count();
    assert_eq!((accepted, caught), (1, 1), "{results:?}");
    assert!(results.iter().all(|r| r.as_ref().err().is_none_or(StoreError::is_transient)));

    // Admitted once: one row, queued behind t0, the session's sequence moved once.
    let rows = turns(&pool, session).await;
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

    drop_database(store, &id).await;
}

/// Admits turn `turn` of `session` with every session column set.
async fn admit_with(store: &Store, session: Uuid, turn: &str, meta: &SessionMeta) -> Admission {
    let request = json!({"SessionId": session, "TurnId": turn, "Instruction": "hello"});
    store.admit_user_turn(&key(session, turn), "fp", &request, meta, None).await.unwrap()
}

/// A new session's first turn, admitted in one round trip (`tests/work_per_turn.rs` counts that
/// it is), writes the session as the transaction did: every column from the turn's session meta.
#[tokio::test]
async fn a_new_sessions_first_turn_writes_its_session_whole() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let meta = SessionMeta {
        tenant: Some("acme".parse().unwrap()),
        agent_context_id: Some("agent".into()),
        conversation_context_id: Some("mode".into()),
        workspace_id: Some("ws".into()),
        repo: Some("repo".into()),
        name: Some("hello".into()),
        expires_at: Some(chrono::DateTime::from_timestamp(2_000_000_000, 0).unwrap()),
        ..SessionMeta::default()
    };
    // Started at once: created with the turn's columns, the turn counted.
    let session = Uuid::now_v7();
    let first = admit_with(&store, session, "t0", &meta).await;
    assert!(
        matches!(first, Admission::Accepted { queued: false, new_session: true, .. }),
        "{first:?}"
    );
    type Columns = (Option<String>, Option<String>, Option<String>, Option<String>);
    let row: (Option<String>, Columns, Option<String>, i64, Option<String>) = sqlx::query_as(
        "SELECT tenant, (agent_context_id, conversation_context_id, workspace_id, repo), name,
                next_seq, active_turn_id FROM sessions WHERE id = $1",
    )
    .bind(session)
    .fetch_one(&pool)
    .await
    .unwrap();
    let text = |s: &str| Some(s.to_owned());
    let columns = (text("agent"), text("mode"), text("ws"), text("repo"));
    assert_eq!(row, (text("acme"), columns, text("hello"), 1, text("t0")));
    let expires: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT expires_at FROM sessions WHERE id = $1")
            .bind(session)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(expires, meta.expires_at);
    assert_eq!(turns(&pool, session).await, [("t0".to_owned(), "running".to_owned(), 0)]);
    assert_eq!(outbox_rows(&pool, session).await, 1, "its start message");

    // A message already waiting for an id no session has (none is written so; one left by
    // hand) is not overtaken: the turn waits for it, and nothing is created meanwhile.
    let waiting = Uuid::now_v7();
    sqlx::query("INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, 'x', '{}')")
        .bind(waiting)
        .execute(&pool)
        .await
        .unwrap();
    let request = json!({"SessionId": waiting, "TurnId": "t0", "Instruction": "hello"});
    let held = store.admit_user_turn(&key(waiting, "t0"), "fp", &request, &meta, None).await;
    assert!(matches!(held, Err(StoreError::ReplyInFlight)), "{held:?}");
    assert!(turns(&pool, waiting).await.is_empty());
    assert_eq!(outbox_rows(&pool, waiting).await, 1);
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE id = $1")
        .bind(waiting)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    drop_database(store, &id).await;
}
