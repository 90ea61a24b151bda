//! Admission of user turns: idempotency by `(SessionId, TurnId)`, one turn at a time per
//! session (later turns queue in arrival order). Tool continuations are in `resume`.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::records::NewRecord;
use super::turns::{TurnRow, TurnState, TURN_COLUMNS};
use super::{Store, StoreError};
use crate::contracts::{ApiError, InstanceName, InvokeResult, Reply, TurnKey};
use crate::messages::{Outgoing, ReplyOut};

/// How long after it was written an unpublished reply is left to its persist worker before a new
/// turn of the session publishes it itself: longer than a reconnect and a redelivery take.
const REPLY_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(5);

/// Session columns a user turn may set.
#[derive(Debug, Clone, Default)]
pub struct SessionMeta {
    /// Requested AgentContext.
    pub agent_context_id: Option<String>,
    /// Requested ConversationContext.
    pub conversation_context_id: Option<String>,
    /// Workspace hint.
    pub workspace_id: Option<String>,
    /// Repository hint.
    pub repo: Option<String>,
}

/// The result of admitting a user turn.
#[derive(Debug)]
pub enum Admission {
    /// A new turn. It runs now (its forward message is in `outbox`) or waits behind the
    /// session's current turn (`outbox` empty).
    Accepted {
        /// Messages to publish.
        outbox: PendingOutbox,
        /// Whether the turn waits behind another.
        queued: bool,
        /// Whether this turn created the session.
        new_session: bool,
    },
    /// The same request was already admitted and has not finished; unpublished messages, if a
    /// crash left any, are in `outbox`.
    InFlight {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The same request already finished: send the stored reply again.
    Finished {
        /// The stored reply.
        reply: Value,
    },
    /// The pair was used with different content.
    Conflict,
    /// The session waits for tool results of another turn.
    AwaitingToolResults {
        /// The waiting turn.
        turn_id: String,
    },
}

async fn lock_session(
    conn: &mut PgConnection,
    session: Uuid,
) -> Result<(Option<String>, i64), StoreError> {
    Ok(sqlx::query_as("SELECT active_turn_id, next_seq FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(session)
        .fetch_one(&mut *conn)
        .await?)
}

pub(super) async fn turn_row(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<Option<TurnRow>, StoreError> {
    let sql = format!("SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND turn_id = $2");
    Ok(sqlx::query_as(&sql).bind(session).bind(turn).fetch_optional(&mut *conn).await?)
}

/// The record and reply of a turn failed at `row`'s step with `error`, and the reply's message.
pub(super) fn failure(
    row: &TurnRow,
    error: ApiError,
    request_payload: Option<Value>,
) -> Result<(NewRecord, Outgoing), StoreError> {
    let reply: Reply = InvokeResult::fail(vec![error.clone()]);
    let key = row.key()?;
    let out =
        ReplyOut::step(key.session_id, key.turn_id.as_str(), row.step, &reply)?.to(row.reply_to()?);
    let record = NewRecord::failure(&[error], out.body.clone(), request_payload)?;
    Ok((record, Outgoing::Reply(out)))
}

impl Store {
    /// Admits a validated user turn; a turn that runs now gets its start message in the outbox.
    pub async fn admit_user_turn(
        &self,
        key: &TurnKey,
        fingerprint: &str,
        request: &Value,
        meta: &SessionMeta,
        reply_to: Option<&InstanceName>,
    ) -> Result<Admission, StoreError> {
        let (session, turn) = (key.session_id.as_uuid(), key.turn_id.as_str());
        let mut tx = self.pool.begin().await?;
        let created = create_session(&mut tx, session, meta).await?;
        let (active, next_seq) = lock_session(&mut tx, session).await?;
        if let Some(existing) = turn_row(&mut tx, session, turn).await? {
            let outcome = if existing.fingerprint != fingerprint {
                Admission::Conflict
            } else if existing.state.is_finished() {
                Admission::Finished { reply: existing.last_reply.unwrap_or(Value::Null) }
            } else {
                Admission::InFlight {
                    outbox: outbox::pending_for_turn(&mut tx, session, turn).await?,
                }
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        if let Some(active) = active {
            if state_of(&mut tx, session, &active).await? == Some(TurnState::AwaitingToolResults) {
                tx.commit().await?;
                return Ok(Admission::AwaitingToolResults { turn_id: active });
            }
            let new = NewTurn { session, turn, seq: next_seq, fingerprint, request, reply_to };
            insert_turn(&mut tx, &new, TurnState::Queued).await?;
            let outbox = outbox::insert(&mut tx, session, turn, Vec::new()).await?;
            tx.commit().await?;
            return Ok(Admission::Accepted { outbox, queued: true, new_session: created });
        }
        // The last turn's reply may still be unpublished: this turn must not overtake it. A
        // fresh one is being published by its persist worker (or will be, when its message comes
        // again after a lost publish): wait and try again. An older one is published here first.
        let Some(mut outbox) = outbox::stale_for_session(&mut tx, session, REPLY_IN_FLIGHT).await?
        else {
            return Err(StoreError::ReplyInFlight);
        };
        let new = NewTurn { session, turn, seq: next_seq, fingerprint, request, reply_to };
        let row = insert_turn(&mut tx, &new, TurnState::Running).await?;
        let start = vec![Outgoing::Start(row.start_job()?)];
        let started = outbox::insert(&mut tx, session, turn, start).await?;
        outbox.ids.extend(started.ids);
        outbox.messages.extend(started.messages);
        tx.commit().await?;
        Ok(Admission::Accepted { outbox, queued: false, new_session: created })
    }
}

/// Creates the session if it is new; whether it was.
async fn create_session(
    conn: &mut PgConnection,
    session: Uuid,
    meta: &SessionMeta,
) -> Result<bool, StoreError> {
    let created = sqlx::query(
        "INSERT INTO sessions (id, agent_context_id, conversation_context_id, workspace_id, repo)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
    )
    .bind(session)
    .bind(&meta.agent_context_id)
    .bind(&meta.conversation_context_id)
    .bind(&meta.workspace_id)
    .bind(&meta.repo)
    .execute(&mut *conn)
    .await?;
    Ok(created.rows_affected() == 1)
}

async fn state_of(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<Option<TurnState>, StoreError> {
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1 AND turn_id = $2")
            .bind(session)
            .bind(turn)
            .fetch_optional(&mut *conn)
            .await?;
    state.map(TurnState::try_from).transpose()
}

/// A turn to insert.
struct NewTurn<'a> {
    session: Uuid,
    turn: &'a str,
    seq: i64,
    fingerprint: &'a str,
    request: &'a Value,
    reply_to: Option<&'a InstanceName>,
}

/// Inserts the turn in `state` and counts it on its session (the first one holds the session).
async fn insert_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    state: TurnState,
) -> Result<TurnRow, StoreError> {
    let sql = format!(
        "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request, reply_to)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {TURN_COLUMNS}"
    );
    let row: TurnRow = sqlx::query_as(&sql)
        .bind(t.session)
        .bind(t.turn)
        .bind(t.seq)
        .bind(state.as_str())
        .bind(t.fingerprint)
        .bind(t.request)
        .bind(t.reply_to.map(InstanceName::as_str))
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE sessions SET next_seq = next_seq + 1, active_turn_id = COALESCE(active_turn_id, $2),
             updated_at = now() WHERE id = $1",
    )
    .bind(t.session)
    .bind(t.turn)
    .execute(&mut *conn)
    .await?;
    Ok(row)
}
