//! Ending admitted turns from outside their stages, and the replies that answer a submission
//! rather than a turn's step.

use serde_json::Value;
use uuid::Uuid;

use super::admit::failure;
use super::outbox::{self, PendingOutbox};
use super::records::insert_record;
use super::turns::{dispatch_next, starts, TurnRow, TURN_COLUMNS};
use super::{Store, StoreError};
use crate::contracts::{ApiError, SessionId, TurnKey};

/// A reply that answers one submission (a refusal), as sent.
#[derive(Debug, Clone)]
pub struct StoredReply<'a> {
    /// The reply's `message_id`.
    pub message_id: &'a str,
    /// The session it was sent to.
    pub session: &'a SessionId,
    /// The turn it names, if the request named a valid one.
    pub turn_id: Option<&'a str>,
    /// `refused`, `failed`, ...
    pub outcome: crate::messages::ReplyOutcome,
    /// The body as sent.
    pub body: &'a Value,
}

impl Store {
    /// Fails the turn that the submission with `fingerprint` admitted, when the message that
    /// admitted it can never be handled again (poison, retries spent): its record, its reply
    /// (with `error`) and the session's next turn, in one transaction. `None` when that
    /// submission admitted nothing that is still open.
    pub async fn fail_admitted(
        &self,
        key: &TurnKey,
        fingerprint: &str,
        error: ApiError,
    ) -> Result<Option<PendingOutbox>, StoreError> {
        let session = key.session_id.as_uuid();
        let turn = key.turn_id.as_str();
        let mut tx = self.pool.begin().await?;
        let (active, tenant): (Option<String>, Option<String>) =
            sqlx::query_as("SELECT active_turn_id, tenant FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(session)
                .fetch_one(&mut *tx)
                .await?;
        let sql =
            format!("SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND turn_id = $2");
        let row: Option<TurnRow> =
            sqlx::query_as(&sql).bind(session).bind(turn).fetch_optional(&mut *tx).await?;
        let Some(row) = row else { return Ok(None) };
        let ours = row.fingerprint == fingerprint
            || row.continuation_fingerprint.as_deref() == Some(fingerprint);
        if !ours || row.state.is_finished() {
            return Ok(None);
        }
        let (record, reply) = failure(&row, error, None)?;
        let mut messages = vec![reply];
        insert_record(&mut tx, session, turn, row.step, &record, None).await?;
        sqlx::query(
            "UPDATE turns SET state = 'failed', step = step + 1, pending_tool_calls = NULL, last_reply = $3,
                 updated_at = now()
             WHERE session_id = $1 AND turn_id = $2",
        )
        .bind(session)
        .bind(turn)
        .bind(&record.reply)
        .execute(&mut *tx)
        .await?;
        // Only the session's active turn (running, awaiting, or held over a tenant's limit)
        // hands the session over; a turn queued behind it was never the active one.
        if active.as_deref() == Some(turn) {
            let gate = self.gate(tenant.as_deref());
            messages.extend(starts(&dispatch_next(&mut tx, session, gate.as_ref()).await?)?);
        }
        let out = outbox::insert(&mut tx, session, turn, messages).await?;
        tx.commit().await?;
        Ok(Some(out))
    }

    /// Keeps a refusal as it was sent; sending the same message again stores nothing new.
    pub async fn save_reply(&self, reply: &StoredReply<'_>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replies (message_id, session_id, turn_id, outcome, body) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(reply.message_id)
        .bind(reply.session.as_uuid())
        .bind(reply.turn_id)
        .bind(reply.outcome.as_str())
        .bind(reply.body)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The refusals sent to a session, oldest first.
    pub async fn session_replies(&self, session: Uuid) -> Result<Vec<Value>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT to_jsonb(r) FROM replies r WHERE session_id = $1 ORDER BY created_at, message_id",
        )
        .bind(session)
        .fetch_all(&self.pool)
        .await?)
    }
}
