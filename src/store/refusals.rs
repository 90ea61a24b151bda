//! The replies that answer a submission rather than a turn's step (refusals, and a finished
//! turn's reply sent again for a duplicate), at most [`MAX_STORED_REFUSALS_PER_TENANT`] per
//! tenant: over it, that tenant's oldest go, so a tenant's flood of refused requests can neither
//! grow the table without bound nor evict another tenant's. A reply sent again is kept by
//! reference to its turn (a few hundred bytes, whatever the answer's size) and read back whole
//! (the view `replies_sent`, migration 0032).

use serde_json::Value;
use uuid::Uuid;

use super::{Store, StoreError};
use crate::contracts::{SessionId, TenantName};

/// Most refusals kept per tenant (a single-tenant deployment's together).
pub const MAX_STORED_REFUSALS_PER_TENANT: i64 = 100_000;

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
    /// Its body.
    pub body: StoredBody<'a>,
    /// The tenant it was sent to (none in a single-tenant deployment).
    pub tenant: Option<&'a TenantName>,
}

/// How a reply's body is kept.
#[derive(Debug, Clone, Copy)]
pub enum StoredBody<'a> {
    /// As sent.
    AsSent(&'a Value),
    /// The reply of the turn it names, sent again ([`crate::messages::ReplyOut::resent`]): read
    /// back from the turn's records, which are never changed.
    TurnsReply,
}

impl Store {
    /// Keeps a refusal as it was sent; sending the same message again stores nothing new. When
    /// its tenant then has more than [`MAX_STORED_REFUSALS_PER_TENANT`], its oldest goes.
    pub async fn save_reply(&self, reply: &StoredReply<'_>) -> Result<(), StoreError> {
        let tenant = reply.tenant.map_or("", TenantName::as_str);
        let (body, resent) = match reply.body {
            StoredBody::AsSent(body) => (Some(body), false),
            StoredBody::TurnsReply => (None, true),
        };
        // The count is a row per tenant, bumped in the statement that stores, so checking the
        // quota never counts the table.
        let stored = sqlx::query_scalar!(
            "WITH kept AS (
                 INSERT INTO replies (message_id, session_id, turn_id, outcome, body, tenant, resent)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (message_id) DO NOTHING RETURNING 1)
             INSERT INTO reply_counts (tenant, n) SELECT $6, 1 FROM kept
             ON CONFLICT (tenant) DO UPDATE SET n = reply_counts.n + 1
             RETURNING n",
            reply.message_id,
            reply.session.as_uuid(),
            reply.turn_id,
            reply.outcome.as_str(),
            body,
            tenant,
            resent
        )
        .fetch_optional(&self.pool)
        .await?;
        if stored.is_some_and(|n| n > MAX_STORED_REFUSALS_PER_TENANT) {
            self.evict_refusals(tenant).await?;
        }
        Ok(())
    }

    /// Removes `tenant`'s oldest refusals down to its quota.
    async fn evict_refusals(&self, tenant: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "WITH over AS (
                 SELECT greatest(n - $2, 0) AS n FROM reply_counts WHERE tenant = $1 FOR UPDATE),
             gone AS (
                 DELETE FROM replies WHERE message_id IN (
                     SELECT message_id FROM replies WHERE tenant = $1
                     ORDER BY created_at, message_id LIMIT coalesce((SELECT n FROM over), 0))
                 RETURNING 1)
             UPDATE reply_counts SET n = n - (SELECT count(*) FROM gone) WHERE tenant = $1",
            tenant,
            MAX_STORED_REFUSALS_PER_TENANT
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The refusal sent to `session` for submission `submission` (its fingerprint ends the
    /// reply's id), if one was: `(message_id, turn_id, body)`.
    pub async fn refusal_of(
        &self,
        session: Uuid,
        submission: &str,
    ) -> Result<Option<(String, Option<String>, Value)>, StoreError> {
        let row = sqlx::query!(
            "SELECT message_id, turn_id, body FROM replies
             WHERE session_id = $1 AND outcome = 'refused' AND message_id LIKE '%-' || $2
                 AND NOT resent LIMIT 1",
            session,
            submission
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| Some((r.message_id, r.turn_id, r.body?))))
    }

    /// The replies sent to a session that no record holds (its newest `newest`, with `Some`),
    /// oldest first, each as sent (`replies_sent` puts back what a row keeps by reference).
    pub async fn session_replies(
        &self,
        session: Uuid,
        newest: Option<i64>,
    ) -> Result<Vec<Value>, StoreError> {
        // `LIMIT NULL` is no limit.
        Ok(sqlx::query_scalar!(
            r#"SELECT to_jsonb(r) AS "row!" FROM (
                   SELECT * FROM replies_sent WHERE session_id = $1
                   ORDER BY created_at DESC, message_id DESC LIMIT $2) r
               ORDER BY r.created_at, r.message_id"#,
            session,
            newest
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
