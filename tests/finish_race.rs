//! A round trip's ending written in one round trip (migration 0030's function) against the
//! transaction it stands in for: the same rows and reply, and what the lock's last holder
//! committed is seen. A single statement would not see it: its snapshot is taken before it
//! waits for the session's lock.
#![allow(clippy::unwrap_used)]

use aptix::config::TenantLimits;
use aptix::contracts::{ApiError, ErrorCode, Reply, SessionId, TurnKey};
use aptix::messages::{Outgoing, ReplyOut};
use aptix::store::{
    Admission, FinishStep, Finished, Gate, NewRecord, PendingOutbox, SessionMeta, StepOutcome,
    Store,
};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::store_support::{drop_database, fresh_store, hold_lock, lock_waiters};

fn key(session: Uuid, turn: &str) -> TurnKey {
    TurnKey { session_id: SessionId::new(session), turn_id: turn.parse().unwrap() }
}

fn request(session: Uuid, turn: &str) -> Value {
    json!({"SessionId": session, "TurnId": turn, "Instruction": "hello"})
}

fn meta() -> SessionMeta {
    SessionMeta {
        name: Some("hello".into()),
        expires_at: Some(chrono::DateTime::from_timestamp(2_000_000_000, 0).unwrap()),
        ..SessionMeta::default()
    }
}

/// A new session whose turn t0 runs.
async fn running(store: &Store) -> Uuid {
    running_as(store, &meta()).await
}

/// A new session of `meta` whose turn t0 runs.
async fn running_as(store: &Store, meta: &SessionMeta) -> Uuid {
    let session = Uuid::now_v7();
    let request = request(session, "t0");
    let admitted =
        store.admit_user_turn(&key(session, "t0"), "fp", &request, meta, None).await.unwrap();
    assert!(matches!(admitted, Admission::Accepted { queued: false, .. }), "{admitted:?}");
    // Its start message published, as the stage deletes it after its confirm.
    sqlx::query("DELETE FROM outbox WHERE session_id = $1")
        .bind(session)
        .execute(store.pool())
        .await
        .unwrap();
    session
}

/// Turn t0's first round trip ending with a reply. `via_transaction`: it names a follow-up to
/// take in, which no turn is (nothing is taken in), so only the transaction can write it.
fn ending(session: Uuid, via_transaction: bool) -> FinishStep {
    let reply = Reply::fail(vec![ApiError::new(ErrorCode::Internal, "an ending")]);
    let reply = ReplyOut::step(SessionId::new(session), "t0", 0, &reply).unwrap();
    let record = NewRecord {
        kind: "final".into(),
        response_payload: Some(json!({"id": "resp_1", "output": []})),
        instruction: Some("hello".into()),
        reply: reply.body.clone(),
        ..NewRecord::failure(&[], json!({}), None).unwrap()
    };
    FinishStep {
        key: key(session, "t0"),
        step: 0,
        record,
        session_state: None,
        outcome: StepOutcome::Completed,
        reply: Some(reply),
        cancelled: false,
        steers: if via_transaction { vec!["absent".into()] } else { Vec::new() },
        settle: None,
        tenant: None,
    }
}

fn done(finished: Finished) -> PendingOutbox {
    match finished {
        Finished::Done(out) => out,
        other => panic!("{other:?}"),
    }
}

/// What an ending left of `session`: its turns, whether it is busy, its record without its
/// keys, and its outbox rows as messages.
async fn written(pool: &PgPool, session: Uuid) -> (Vec<(String, String, i32)>, bool, Value) {
    let turns =
        sqlx::query_as("SELECT turn_id, state, step FROM turns WHERE session_id = $1 ORDER BY seq")
            .bind(session)
            .fetch_all(pool)
            .await
            .unwrap();
    let busy = sqlx::query_scalar("SELECT active_turn_id IS NOT NULL FROM sessions WHERE id = $1")
        .bind(session)
        .fetch_one(pool)
        .await
        .unwrap();
    let record = sqlx::query_scalar(
        "SELECT to_jsonb(r) - 'id' - 'session_id' - 'created_at' FROM response_records r
         WHERE session_id = $1",
    )
    .bind(session)
    .fetch_one(pool)
    .await
    .unwrap();
    (turns, busy, record)
}

async fn outbox(pool: &PgPool, session: Uuid, turn: &str) -> Vec<Outgoing> {
    let rows: Vec<Value> = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE session_id = $1 AND turn_id = $2 ORDER BY id",
    )
    .bind(session)
    .bind(turn)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().map(|p| serde_json::from_value(p).unwrap()).collect()
}

#[tokio::test]
async fn an_ending_written_at_once_writes_what_the_transaction_writes() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let (at_once, via_tx) = (running(&store).await, running(&store).await);

    let mut sent = Vec::new();
    for (session, transaction) in [(at_once, false), (via_tx, true)] {
        let out = done(store.finish_step(ending(session, transaction)).await.unwrap());
        // The reply names the session as the transaction names it, in the outbox and as sent.
        let [Outgoing::Reply(reply)] = &out.messages[..] else { panic!("{out:?}") };
        assert_eq!(reply.session_name.as_deref(), Some("hello"));
        assert_eq!(reply.session_expires, meta().expires_at);
        assert_eq!(outbox(&pool, session, "t0").await, out.messages);
        sent.push(written(&pool, session).await);
    }
    // The function wrote the first: the expiry in its reply's row is PostgreSQL's text of it
    // (serde writes `Z`).
    let expires: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'session_expires' FROM outbox WHERE session_id = ANY($1) ORDER BY id",
    )
    .bind([at_once, via_tx])
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(expires[0].ends_with("+00:00") && expires[1].ends_with('Z'), "{expires:?}");
    assert_eq!(sent[0].0, [("t0".to_owned(), "completed".to_owned(), 1)]);
    assert!(!sent[0].1, "the session is free");
    assert_eq!(sent[0], sent[1]);

    // A repeat writes nothing more: the transaction finds the record and its reply.
    let again = done(store.finish_step(ending(at_once, false)).await.unwrap());
    assert_eq!(again.messages, outbox(&pool, at_once, "t0").await);
    let records: i64 =
        sqlx::query_scalar("SELECT count(*) FROM response_records").fetch_one(&pool).await.unwrap();
    assert_eq!(records, 2);
    drop_database(store, &id).await;
}

#[tokio::test]
async fn a_turn_queued_while_the_lock_was_awaited_starts_when_the_running_one_ends() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let session = running(&store).await;

    // The lock's holder queues t1 behind t0, as admission does, while t0's ending waits.
    let mut holder = hold_lock(&pool, session).await;
    let s = store.clone();
    let ends = tokio::spawn(async move { s.finish_step(ending(session, false)).await });
    lock_waiters(&pool, 1).await;
    sqlx::query(
        "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request)
         VALUES ($1, 't1', 1, 'queued', 'fp', $2)",
    )
    .bind(session)
    .bind(request(session, "t1"))
    .execute(&mut *holder)
    .await
    .unwrap();
    sqlx::query("UPDATE sessions SET next_seq = 2 WHERE id = $1")
        .bind(session)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder.commit().await.unwrap();

    // The ending sees t1 and hands the session to it: t1 runs, and its start message goes out
    // after t0's reply.
    let out = done(ends.await.unwrap().unwrap());
    let kinds: Vec<&str> = out
        .messages
        .iter()
        .map(|m| match m {
            Outgoing::Reply(_) => "reply",
            Outgoing::Start(s) => s.key.turn_id.as_str(),
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["reply", "t1"]);
    let (turns, busy, _) = written(&pool, session).await;
    let states: Vec<(&str, &str)> = turns.iter().map(|t| (t.0.as_str(), t.1.as_str())).collect();
    assert_eq!(states, [("t0", "completed"), ("t1", "running")]);
    assert!(busy, "the session is t1's");
    let active: Option<String> =
        sqlx::query_scalar("SELECT active_turn_id FROM sessions WHERE id = $1")
            .bind(session)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(active.as_deref(), Some("t1"));
    drop_database(store, &id).await;
}

/// Turn t1 of `session`, taken in by t0 (a follow-up that steered it) at an earlier round trip.
async fn taken_in(pool: &PgPool, session: Uuid) {
    sqlx::query(
        "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request, steers)
         VALUES ($1, 't1', 1, 'steered', 'fp', $2, 't0')",
    )
    .bind(session)
    .bind(request(session, "t1"))
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn endings_the_function_leaves_to_the_transaction_end_as_before() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();

    // A follow-up t0 took in earlier ends with it, told t0's ending, whichever round trip ends
    // t0 (this one takes in nothing new).
    let session = running(&store).await;
    taken_in(&pool, session).await;
    let out = done(store.finish_step(ending(session, false)).await.unwrap());
    let told: Vec<Option<&str>> = out
        .messages
        .iter()
        .map(|m| match m {
            Outgoing::Reply(r) => r.turn_id.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(told, [Some("t0"), Some("t1")]);
    let (turns, busy, _) = written(&pool, session).await;
    let states: Vec<(&str, &str)> = turns.iter().map(|t| (t.0.as_str(), t.1.as_str())).collect();
    assert_eq!(states, [("t0", "completed"), ("t1", "completed")]);
    assert!(!busy);

    // A cancel admitted while the round trip ran: nothing written, it must end as cancelled.
    let session = running(&store).await;
    sqlx::query("UPDATE turns SET cancel_requested_at = now() WHERE session_id = $1")
        .bind(session)
        .execute(&pool)
        .await
        .unwrap();
    let refused = store.finish_step(ending(session, false)).await.unwrap();
    assert!(matches!(refused, Finished::CancelRequested), "{refused:?}");
    let records: i64 =
        sqlx::query_scalar("SELECT count(*) FROM response_records WHERE session_id = $1")
            .bind(session)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(records, 0);
    drop_database(store, &id).await;
}

/// The tokens charged to `tenant`.
async fn charged_tokens(pool: &PgPool, tenant: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(tokens), 0)::bigint FROM tenant_tokens WHERE tenant = $1",
    )
    .bind(tenant)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The tokens charged to `tenant`, and `session`'s reply row's expiry as written.
async fn charged_and_written(pool: &PgPool, tenant: &str, session: Uuid) -> (i64, String) {
    let expires = sqlx::query_scalar(
        "SELECT payload->>'session_expires' FROM outbox WHERE session_id = $1 AND turn_id = 't0'",
    )
    .bind(session)
    .fetch_one(pool)
    .await
    .unwrap();
    (charged_tokens(pool, tenant).await, expires)
}

#[tokio::test]
async fn a_tenant_without_limits_ends_at_once_and_one_with_a_limit_in_the_transaction() {
    let (store, id) = fresh_store().await;
    let pool = store.pool().clone();
    let gate = |tenant: &str, limits| Gate { tenant: tenant.parse().unwrap(), limits };
    let capped = TenantLimits { turns_in_flight: 5, ..TenantLimits::default() };
    let store =
        store.with_tenants(vec![gate("free", TenantLimits::default()), gate("capped", capped)]);

    // (tenant, ending as the transaction would, tokens charged, the reply row's expiry's end):
    // tokens are kept for a limit to read, so a tenant with none is charged nothing, whichever
    // way its ending goes. The function's reply row holds PostgreSQL's text of the expiry, the
    // transaction's serde's.
    let cases = [("free", false, 0, "+00:00"), ("free", true, 0, "Z"), ("capped", false, 12, "Z")];
    for (tenant, via_transaction, tokens, written) in cases {
        let charged_before = charged_tokens(&pool, tenant).await;
        let meta = SessionMeta { tenant: Some(tenant.parse().unwrap()), ..meta() };
        let session = running_as(&store, &meta).await;
        let mut end = ending(session, via_transaction);
        end.tenant = meta.tenant.clone();
        end.record.usage = Some(json!({"TotalTokens": 12}));
        done(store.finish_step(end).await.unwrap());
        let (charged, expires) = charged_and_written(&pool, tenant, session).await;
        assert_eq!(charged - charged_before, tokens, "{tenant} {via_transaction}");
        assert!(expires.ends_with(written), "{tenant} {via_transaction}: {expires}");
    }
    drop_database(store, &id).await;
}
