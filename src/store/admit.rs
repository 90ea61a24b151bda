//! Admission of turns: idempotency by `(SessionId, TurnId)`, one turn at a time per session
//! (later turns queue in arrival order), and tool continuations resuming the waiting turn.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::records::{dispatch_next, insert_record, NewRecord, TurnRow, TurnState, TURN_COLUMNS};
use super::{Store, StoreError};
use crate::contracts::{ApiError, ErrorCode, InvokeResult, Reply, ToolCall, ToolContinuation, TurnKey};
use crate::messages::{Outgoing, ReplyOut};

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

/// The result of admitting a tool continuation.
#[derive(Debug)]
pub enum ContinuationAdmission {
    /// The turn resumes; its forward message is in `outbox`.
    Accepted {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The same continuation was already applied.
    InFlight {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The same continuation was applied and the turn finished.
    Finished {
        /// The stored reply.
        reply: Value,
    },
    /// No such turn in this session.
    NotFound,
    /// The turn is not waiting for tool results.
    NotAwaiting {
        /// Its state.
        state: TurnState,
    },
    /// The results did not match; the turn was failed and its error reply is in `outbox`.
    Aborted {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
}

async fn lock_session(conn: &mut PgConnection, session: Uuid) -> Result<(Option<String>, i64), StoreError> {
    Ok(sqlx::query_as("SELECT active_turn_id, next_seq FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(session)
        .fetch_one(&mut *conn)
        .await?)
}

async fn turn_row(conn: &mut PgConnection, session: Uuid, turn: &str) -> Result<Option<TurnRow>, StoreError> {
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
    let out = ReplyOut::step(key.session_id, key.turn_id.as_str(), row.step, &reply)?;
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
    ) -> Result<Admission, StoreError> {
        let session = key.session_id.as_uuid();
        let turn = key.turn_id.as_str();
        let mut tx = self.pool.begin().await?;
        let created = sqlx::query(
            "INSERT INTO sessions (id, agent_context_id, conversation_context_id, workspace_id, repo)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
        )
        .bind(session)
        .bind(&meta.agent_context_id)
        .bind(&meta.conversation_context_id)
        .bind(&meta.workspace_id)
        .bind(&meta.repo)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let (active, next_seq) = lock_session(&mut tx, session).await?;
        if let Some(existing) = turn_row(&mut tx, session, turn).await? {
            let outcome = if existing.fingerprint != fingerprint {
                Admission::Conflict
            } else if existing.state.is_finished() {
                Admission::Finished { reply: existing.last_reply.unwrap_or(Value::Null) }
            } else {
                Admission::InFlight { outbox: outbox::pending_for_turn(&mut tx, session, turn).await? }
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        if let Some(active) = &active {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1 AND turn_id = $2")
                    .bind(session)
                    .bind(active)
                    .fetch_optional(&mut *tx)
                    .await?;
            if state.as_deref() == Some(TurnState::AwaitingToolResults.as_str()) {
                tx.commit().await?;
                return Ok(Admission::AwaitingToolResults { turn_id: active.clone() });
            }
        }
        let queued = active.is_some();
        let sql = format!(
            "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING {TURN_COLUMNS}"
        );
        let row: TurnRow = sqlx::query_as(&sql)
            .bind(session)
            .bind(turn)
            .bind(next_seq)
            .bind(if queued { TurnState::Queued } else { TurnState::Running }.as_str())
            .bind(fingerprint)
            .bind(request)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE sessions SET next_seq = next_seq + 1, active_turn_id = COALESCE(active_turn_id, $2),
                 updated_at = now() WHERE id = $1",
        )
        .bind(session)
        .bind(turn)
        .execute(&mut *tx)
        .await?;
        let messages = if queued { Vec::new() } else { vec![Outgoing::Start(row.start_job()?)] };
        let outbox = outbox::insert(&mut tx, session, turn, messages).await?;
        tx.commit().await?;
        Ok(Admission::Accepted { outbox, queued, new_session: created })
    }

    /// Admits a tool continuation (`continuation` is `parsed` in wire form). Results that do
    /// not match the pending calls end the turn with an error record and reply.
    pub async fn admit_continuation(
        &self,
        key: &TurnKey,
        fingerprint: &str,
        continuation: &Value,
        parsed: &ToolContinuation,
    ) -> Result<ContinuationAdmission, StoreError> {
        let session = key.session_id.as_uuid();
        let turn = key.turn_id.as_str();
        let mut tx = self.pool.begin().await?;
        let locked: Option<i32> = sqlx::query_scalar("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
            .bind(session)
            .fetch_optional(&mut *tx)
            .await?;
        let row = match locked {
            None => None,
            Some(_) => turn_row(&mut tx, session, turn).await?,
        };
        let Some(mut row) = row else {
            tx.commit().await?;
            return Ok(ContinuationAdmission::NotFound);
        };
        if row.continuation_fingerprint.as_deref() == Some(fingerprint)
            && row.state != TurnState::AwaitingToolResults
        {
            let outcome = if row.state.is_finished() {
                ContinuationAdmission::Finished { reply: row.last_reply.clone().unwrap_or(Value::Null) }
            } else {
                ContinuationAdmission::InFlight {
                    outbox: outbox::pending_for_turn(&mut tx, session, turn).await?,
                }
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        if row.state != TurnState::AwaitingToolResults {
            tx.commit().await?;
            return Ok(ContinuationAdmission::NotAwaiting { state: row.state });
        }
        let pending: Vec<ToolCall> =
            row.pending_tool_calls.clone().map(serde_json::from_value).transpose()?.unwrap_or_default();
        if let Err(mismatch) = crate::assemble::check_tool_results(&pending, parsed) {
            let reason = mismatch.to_api_error().message;
            let error = ApiError::at(ErrorCode::ToolResultsMismatch, "ToolResults", reason);
            let (record, reply) = failure(&row, error, Some(continuation.clone()))?;
            let mut messages = vec![reply];
            insert_record(&mut tx, session, turn, row.step, &record, None).await?;
            sqlx::query(
                "UPDATE turns SET state = 'failed', step = step + 1, pending_tool_calls = NULL, last_reply = $3,
                     continuation = $4, continuation_fingerprint = $5, updated_at = now()
                 WHERE session_id = $1 AND turn_id = $2",
            )
            .bind(session)
            .bind(turn)
            .bind(&record.reply)
            .bind(continuation)
            .bind(fingerprint)
            .execute(&mut *tx)
            .await?;
            if let Some(next) = dispatch_next(&mut tx, session).await? {
                messages.push(Outgoing::Start(next.start_job()?));
            }
            let outbox = outbox::insert(&mut tx, session, turn, messages).await?;
            tx.commit().await?;
            return Ok(ContinuationAdmission::Aborted { outbox });
        }
        sqlx::query(
            "UPDATE turns SET state = 'running', continuation = $3, continuation_fingerprint = $4, updated_at = now()
             WHERE session_id = $1 AND turn_id = $2",
        )
        .bind(session)
        .bind(turn)
        .bind(continuation)
        .bind(fingerprint)
        .execute(&mut *tx)
        .await?;
        row.state = TurnState::Running;
        row.continuation = Some(continuation.clone());
        let outbox = outbox::insert(&mut tx, session, turn, vec![Outgoing::Start(row.start_job()?)]).await?;
        tx.commit().await?;
        Ok(ContinuationAdmission::Accepted { outbox })
    }
}
