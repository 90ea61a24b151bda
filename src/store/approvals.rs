//! Approval requests that expired: their calls are denied as if the client had denied each
//! one, and the turn runs on (docs/tools.md, "Approvals"). Decided under the session's lock,
//! like a client's decisions, so an expiry and a late decision never both apply.

use super::outbox::PendingOutbox;
use super::resume::{expired, resume, Submitted, EXPIRED};
use super::turn_row::turn_row;
use super::turns::TurnState;
use super::{Store, StoreError};
use crate::contracts::{ToolApproval, ToolCall, ToolContinuation, ValidatedRequest};
use crate::lifecycle::Event;

/// What the model reads of a call whose approval request expired.
pub const EXPIRY_MESSAGE: &str = "the approval request expired before anyone decided";

/// How many expired requests one pass decides.
const BATCH: i64 = 50;

impl Store {
    /// Denies the calls of approval requests that expired and resumes their turns; the start
    /// messages to publish are returned. A pass takes each tenant's earliest in turn (every
    /// tenant's first, then every tenant's second, ...), so a tenant that parks more gated
    /// turns than a pass decides delays its own expiries, not the others'.
    pub async fn expire_approvals(&self) -> Result<PendingOutbox, StoreError> {
        let due = sqlx::query!(
            r#"SELECT session_id AS "session_id!", turn_id AS "turn_id!" FROM (
                   SELECT session_id, turn_id, approval_expires_at,
                          row_number() OVER (PARTITION BY tenant
                                             ORDER BY approval_expires_at) AS nth
                   FROM turns
                   WHERE state = 'awaiting_approval' AND approval_expires_at < now()) due
               ORDER BY nth, approval_expires_at LIMIT $1"#,
            BATCH
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = PendingOutbox::default();
        for turn in due {
            match self.expire(turn.session_id, &turn.turn_id).await {
                Ok(started) => out.append(started),
                // One turn that cannot be expired (its stored data unusable) must not stop the
                // others': it is left for an operator and tried again later, out of the way of
                // the next passes, which read the earliest expiries first.
                Err(error) if !error.is_transient() => {
                    tracing::error!(
                        session = %turn.session_id, turn = turn.turn_id, %error,
                        "an expired approval request could not be denied; the turn stays waiting"
                    );
                    self.expire_later(turn.session_id, &turn.turn_id).await?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(out)
    }

    /// Puts a waiting turn's expiry an hour ahead: [`Self::expire_approvals`] tries it again
    /// then, and meanwhile takes the expiries after it.
    async fn expire_later(&self, session: uuid::Uuid, turn: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE turns SET approval_expires_at = now() + interval '1 hour'
             WHERE session_id = $1 AND turn_id = $2 AND state = 'awaiting_approval'",
            session,
            turn
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn expire(&self, session: uuid::Uuid, turn: &str) -> Result<PendingOutbox, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query!("SELECT id FROM sessions WHERE id = $1 FOR UPDATE", session)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = turn_row(&mut tx, session, turn).await? else {
            return Ok(Default::default());
        };
        // Decided meanwhile (by the client, a cancel or another process's pass).
        if row.state != TurnState::AwaitingApproval || !expired(&mut tx, &row).await? {
            return Ok(Default::default());
        }
        let pending: Vec<ToolCall> =
            row.pending_tool_calls.as_ref().map(|p| p.0.clone()).unwrap_or_default();
        let denied = pending
            .iter()
            .map(|c| ToolApproval {
                tool_call_id: c.tool_call_id.clone(),
                approved: false,
                message: Some(EXPIRY_MESSAGE.to_owned()),
            })
            .collect();
        let key = row.key()?;
        let wire = serde_json::to_value(ValidatedRequest::ToolContinuation(ToolContinuation {
            key,
            results: Vec::new(),
            approvals: denied,
        }))?;
        let reply_to = row.reply_to()?;
        let submitted = Submitted {
            wire: &wire,
            fingerprint: EXPIRED,
            reply_to: reply_to.as_ref(),
            gate: None,
        };
        let out = resume(&mut tx, row, &submitted, Event::ApprovalExpired).await?;
        tx.commit().await?;
        tracing::info!(%session, turn, "approval request expired; its calls were denied");
        Ok(out)
    }

    /// Start messages of turns resumed by an expiry that stayed unpublished for `age` (the
    /// process that decided stopped before publishing them).
    pub async fn orphaned_expiries(
        &self,
        age: std::time::Duration,
    ) -> Result<PendingOutbox, StoreError> {
        let rows = sqlx::query_as!(
            super::outbox::OutboxRow,
            r#"SELECT o.id, o.payload, o.exchange, o.routing_key, o.message_id, o.kind,
                      o.declare_session, o.headers, o.body, false AS "fresh!"
               FROM outbox o JOIN turns t ON t.session_id = o.session_id AND t.turn_id = o.turn_id
               WHERE t.continuation_fingerprint = 'expired' AND t.state = 'running'
                 AND o.payload->>'Kind' = 'outgoing.start/v1'
                 AND o.created_at < now() - make_interval(secs => $1)
               ORDER BY o.id LIMIT 100"#,
            age.as_secs_f64()
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(super::outbox::decode_each(&rows))
    }
}
