//! The record of what operators did (`operator_actions`): each action is written before it is
//! done and finished after, so the log also shows actions a crash cut short.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::{Store, StoreError};

/// One recorded operator action.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorAction {
    /// Its number.
    pub id: i64,
    /// When it started.
    pub at: DateTime<Utc>,
    /// Who did it (`--actor`, the console's admin, or the OS user).
    pub actor: String,
    /// `dead.replay` or `dead.discard`.
    pub action: String,
    /// The message it was about.
    pub message_id: String,
    /// What was known about the message (its reason, stage, queue, session, turn).
    pub detail: Value,
    /// `started`, `done`, `not_found`, `refused` or `failed`.
    pub outcome: String,
}

impl Store {
    /// Records that `actor` starts `action` on `message_id`; returns the row's id.
    pub async fn start_action(
        &self,
        actor: &str,
        action: &str,
        message_id: &str,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar!(
            "INSERT INTO operator_actions (actor, action, message_id) VALUES ($1, $2, $3) RETURNING id",
            actor,
            action,
            message_id
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Records how action `id` ended, with what was known about its message.
    pub async fn finish_action(
        &self,
        id: i64,
        outcome: &str,
        detail: &Value,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE operator_actions SET outcome = $2, detail = $3, finished_at = now() WHERE id = $1",
            id,
            outcome,
            detail
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Action `id`, if it was recorded.
    pub async fn action(&self, id: i64) -> Result<Option<OperatorAction>, StoreError> {
        Ok(sqlx::query_as!(
            OperatorAction,
            "SELECT id, at, actor, action, message_id, detail, outcome FROM operator_actions
             WHERE id = $1",
            id
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The latest `limit` actions, newest first.
    pub async fn actions(&self, limit: i64) -> Result<Vec<OperatorAction>, StoreError> {
        Ok(sqlx::query_as!(
            OperatorAction,
            "SELECT id, at, actor, action, message_id, detail, outcome FROM operator_actions
             ORDER BY at DESC, id DESC LIMIT $1",
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
