//! Resuming a turn with the client's tool results: the same submission again gets its earlier
//! outcome, results that answer the pending calls resume the turn, others end it with an error
//! record and reply, all in one transaction.

use serde_json::Value;
use sqlx::{PgConnection, Postgres, Transaction};

use super::admit::failure;
use super::new_record::insert_record;
use super::outbox::{self, PendingOutbox};
use super::tenants::Gate;
use super::texts::TextCache;
use super::turn_row::turn_row;
use super::turns::{dispatch_next, finished_reply, starts, TurnRow, TurnState};
use super::{Store, StoreError};
use crate::config::ContextVersions;
use crate::contracts::{
    ApiError, ErrorCode, InstanceName, TenantName, ToolCall, ToolContinuation, TurnKey,
};
use crate::lifecycle::{transition, Event};
use crate::llm::RequestBody;
use crate::messages::Outgoing;

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
    /// The session belongs to another tenant: nothing was read or written.
    Unavailable,
    /// The turn was cancelled; the results were not used.
    Cancelled,
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

/// A continuation as it is stored on its turn: its wire form and fingerprint.
struct Submitted<'a> {
    wire: &'a Value,
    fingerprint: &'a str,
    /// Where the replies of the round trip it starts go.
    reply_to: Option<&'a InstanceName>,
    /// The session's tenant's limits, for the turn it may hand the session to.
    gate: Option<Gate>,
}

impl Store {
    /// Admits a tool continuation (`continuation` is `parsed` in wire form). Results that do
    /// not match the pending calls end the turn with an error record and reply.
    pub async fn admit_continuation(
        &self,
        key: &TurnKey,
        fingerprint: &str,
        continuation: &Value,
        parsed: &ToolContinuation,
        reply_to: Option<&InstanceName>,
        tenant: Option<&TenantName>,
    ) -> Result<ContinuationAdmission, StoreError> {
        let (session, turn) = (key.session_id.as_uuid(), key.turn_id.as_str());
        let mut tx = self.pool.begin().await?;
        let locked =
            sqlx::query_scalar!("SELECT tenant FROM sessions WHERE id = $1 FOR UPDATE", session)
                .fetch_optional(&mut *tx)
                .await?;
        let row = match &locked {
            None => None,
            Some(owner) if owner.as_deref() != tenant.map(TenantName::as_str) => {
                return Ok(ContinuationAdmission::Unavailable);
            }
            Some(_) => turn_row(&mut tx, session, turn).await?,
        };
        let gate = self.gate(locked.flatten().as_deref());
        let submitted = Submitted { wire: continuation, fingerprint, reply_to, gate };
        let outcome = match row {
            None => ContinuationAdmission::NotFound,
            Some(row) => {
                let stored = (&self.texts, &*self.versions);
                decide(&mut tx, stored, row, &submitted, parsed).await?
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }
}

async fn decide(
    tx: &mut Transaction<'static, Postgres>,
    (cache, versions): (&TextCache, &ContextVersions),
    mut row: TurnRow,
    submitted: &Submitted<'_>,
    parsed: &ToolContinuation,
) -> Result<ContinuationAdmission, StoreError> {
    let repeated = row.continuation_fingerprint.as_deref() == Some(submitted.fingerprint);
    if repeated && row.state != TurnState::AwaitingToolResults {
        return Ok(if row.state.is_finished() {
            ContinuationAdmission::Finished { reply: finished_reply(tx, &row).await? }
        } else {
            let outbox = outbox::pending_for_turn(tx, row.session_id, &row.turn_id).await?;
            ContinuationAdmission::InFlight { outbox }
        });
    }
    if row.cancel_requested_at.is_some() {
        return Ok(ContinuationAdmission::Cancelled);
    }
    if row.state != TurnState::AwaitingToolResults {
        return Ok(ContinuationAdmission::NotAwaiting { state: row.state });
    }
    // The round trip this continuation starts (or the failure it ends in) answers it.
    row.reply_to = submitted.reply_to.map(ToString::to_string);
    let pending: Vec<ToolCall> =
        row.pending_tool_calls.as_ref().map(|p| p.0.clone()).unwrap_or_default();
    match crate::assemble::check_tool_results(&pending, parsed) {
        Err(mismatch) => {
            let reason = mismatch.to_api_error().message;
            let error = ApiError::at(ErrorCode::ToolResultsMismatch, "ToolResults", reason);
            Ok(ContinuationAdmission::Aborted {
                outbox: abort(tx, (cache, versions), &row, error, submitted).await?,
            })
        }
        Ok(()) => Ok(ContinuationAdmission::Accepted { outbox: resume(tx, row, submitted).await? }),
    }
}

/// Ends the turn: the error record and reply, and the session's next turn.
async fn abort(
    tx: &mut PgConnection,
    (cache, versions): (&TextCache, &ContextVersions),
    row: &TurnRow,
    error: ApiError,
    submitted: &Submitted<'_>,
) -> Result<PendingOutbox, StoreError> {
    let (session, turn) = (row.session_id, row.turn_id.as_str());
    let (record, reply) = failure(row, error, Some(RequestBody::new(submitted.wire)), versions)?;
    let to = transition(Some(row.phase(true)), Event::ToolResults { matching: false })?;
    insert_record(tx, cache, (session, turn, row.step), &record).await?;
    sqlx::query!(
        "UPDATE turns SET state = $6, step = step + 1, pending_tool_calls = NULL, last_reply = NULL,
             continuation = $3, continuation_fingerprint = $4, reply_to = $5, updated_at = now()
         WHERE session_id = $1 AND turn_id = $2",
        session,
        turn,
        submitted.wire,
        submitted.fingerprint,
        row.reply_to.as_deref(),
        to.column().as_str()
    )
    .execute(&mut *tx)
    .await?;
    // Its reply, then those of follow-ups an earlier round trip took in, then the next turn.
    let mut out = super::steer::ending(tx, cache, session, turn, reply, to).await?;
    let next = starts(&dispatch_next(tx, session, submitted.gate.as_ref()).await?)?;
    out.append(outbox::insert(tx, session, turn, next).await?);
    Ok(out)
}

/// Resumes the turn at its next step.
async fn resume(
    tx: &mut PgConnection,
    mut row: TurnRow,
    submitted: &Submitted<'_>,
) -> Result<PendingOutbox, StoreError> {
    let to = transition(Some(row.phase(true)), Event::ToolResults { matching: true })?;
    sqlx::query!(
        "UPDATE turns SET state = $6, continuation = $3, continuation_fingerprint = $4,
             reply_to = $5, updated_at = now()
         WHERE session_id = $1 AND turn_id = $2",
        row.session_id,
        &row.turn_id,
        submitted.wire,
        submitted.fingerprint,
        row.reply_to.as_deref(),
        to.column().as_str()
    )
    .execute(&mut *tx)
    .await?;
    row.state = to.column();
    row.continuation = Some(submitted.wire.clone());
    let start = vec![Outgoing::Start(row.start_job()?)];
    outbox::insert(tx, row.session_id, &row.turn_id, start).await
}
