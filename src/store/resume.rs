//! Resuming a turn with the client's tool results or approval decisions: the same submission
//! again gets its earlier outcome, an answer that matches the pending calls resumes the turn,
//! others end it with an error record and reply, all in one transaction.

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
    /// Decisions came after the approval request expired (its calls were denied).
    Expired,
    /// The results did not match; the turn was failed and its error reply is in `outbox`.
    Aborted {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
}

/// A continuation as it is stored on its turn: its wire form and fingerprint.
pub(super) struct Submitted<'a> {
    pub(super) wire: &'a Value,
    pub(super) fingerprint: &'a str,
    /// Where the replies of the round trip it starts go.
    pub(super) reply_to: Option<&'a InstanceName>,
    /// The session's tenant's limits, for the turn it may hand the session to.
    pub(super) gate: Option<Gate>,
}

/// The `continuation_fingerprint` of a turn whose approval request expired: no client's
/// submission has it (theirs are SHA-256 hex).
pub(super) const EXPIRED: &str = "expired";

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
    // The same submission again: whatever it started, however far the turn went since (a late
    // copy must not be checked against calls asked after it), unless the turn now waits for an
    // answer to calls with exactly its ids (a provider that repeats call ids across steps).
    let repeated = row.continuation_fingerprint.as_deref() == Some(submitted.fingerprint);
    if repeated && !answers_pending(&row, parsed) {
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
    let approving = parsed.is_approval();
    if row.state != awaited(parsed) {
        if approving && row.continuation_fingerprint.as_deref() == Some(EXPIRED) {
            return Ok(ContinuationAdmission::Expired);
        }
        return Ok(ContinuationAdmission::NotAwaiting { state: row.state });
    }
    let pending: Vec<ToolCall> =
        row.pending_tool_calls.as_ref().map(|p| p.0.clone()).unwrap_or_default();
    // Decisions on none of the calls asked about answer an earlier request (one that expired,
    // or was answered already): refused, so a late client cannot abort the request that waits.
    let names_none = parsed
        .approvals()
        .iter()
        .all(|a| !pending.iter().any(|c| c.tool_call_id == a.tool_call_id));
    if approving && names_none {
        return Ok(ContinuationAdmission::NotAwaiting { state: row.state });
    }
    // Past its expiry a request takes no decision, even before the expiry loop denied its calls.
    if approving && expired(tx, &row).await? {
        return Ok(ContinuationAdmission::Expired);
    }
    // The round trip this continuation starts (or the failure it ends in) answers it.
    row.reply_to = submitted.reply_to.map(ToString::to_string);
    let checked = if approving {
        approvals_match(&pending, parsed)
            .map_err(|why| ApiError::at(ErrorCode::ToolApprovalsMismatch, "ToolApprovals", why))
    } else {
        crate::assemble::check_tool_results(&pending, parsed).map_err(|mismatch| {
            let reason = mismatch.to_api_error().message;
            ApiError::at(ErrorCode::ToolResultsMismatch, "ToolResults", reason)
        })
    };
    let (ok, failed) = if approving {
        (Event::Approvals { matching: true }, Event::Approvals { matching: false })
    } else {
        (Event::ToolResults { matching: true }, Event::ToolResults { matching: false })
    };
    match checked {
        Err(error) => Ok(ContinuationAdmission::Aborted {
            outbox: abort(tx, (cache, versions), &row, error, submitted, failed).await?,
        }),
        Ok(()) => {
            Ok(ContinuationAdmission::Accepted { outbox: resume(tx, row, submitted, ok).await? })
        }
    }
}

/// The state a turn waits in for `parsed`.
fn awaited(parsed: &ToolContinuation) -> TurnState {
    if parsed.is_approval() {
        TurnState::AwaitingApproval
    } else {
        TurnState::AwaitingToolResults
    }
}

/// Whether `parsed` answers, id for id, the calls the turn waits for now.
fn answers_pending(row: &TurnRow, parsed: &ToolContinuation) -> bool {
    let pending = row.pending_tool_calls.as_ref().map(|p| p.0.as_slice()).unwrap_or_default();
    row.state == awaited(parsed)
        && pending.iter().map(|c| c.tool_call_id.as_str()).eq(parsed.answered_ids())
}

/// Whether the turn's approval request is past its expiry (read under the session's lock by
/// a client's decisions and by the expiry alike). The clock is read now, not at the start of
/// the transaction, which began before the wait for the lock: decisions that got the lock after
/// the expiry are refused, as docs/tools.md says.
pub(super) async fn expired(tx: &mut PgConnection, row: &TurnRow) -> Result<bool, StoreError> {
    let due = sqlx::query_scalar!(
        r#"SELECT approval_expires_at <= clock_timestamp() AS "due!" FROM turns
           WHERE session_id = $1 AND turn_id = $2 AND approval_expires_at IS NOT NULL"#,
        row.session_id,
        &row.turn_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    Ok(due == Some(true))
}

/// Whether `parsed`'s decisions answer exactly the calls awaiting approval: count, ids, order.
fn approvals_match(pending: &[ToolCall], parsed: &ToolContinuation) -> Result<(), String> {
    let asked: Vec<&str> = pending.iter().map(|c| c.tool_call_id.as_str()).collect();
    let answered = parsed.answered_ids();
    if asked == answered {
        return Ok(());
    }
    Err(format!(
        "decisions do not match the calls awaiting approval: asked [{}], answered [{}]",
        asked.join(", "),
        answered.join(", ")
    ))
}

/// Ends the turn: the error record and reply, and the session's next turn.
async fn abort(
    tx: &mut PgConnection,
    (cache, versions): (&TextCache, &ContextVersions),
    row: &TurnRow,
    error: ApiError,
    submitted: &Submitted<'_>,
    event: Event,
) -> Result<PendingOutbox, StoreError> {
    let (session, turn) = (row.session_id, row.turn_id.as_str());
    let (record, reply) = failure(row, error, Some(RequestBody::new(submitted.wire)), versions)?;
    let to = transition(Some(row.phase(true)), event)?;
    insert_record(tx, cache, (session, turn, row.step), &record).await?;
    sqlx::query!(
        "UPDATE turns SET state = $6, step = step + 1, pending_tool_calls = NULL, last_reply = NULL,
             approval_expires_at = NULL,
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

/// Resumes the turn at its next step. Decisions on calls awaiting approval leave no pending
/// calls: retrieve lists every server call of the answer again as it runs or denies it.
pub(super) async fn resume(
    tx: &mut PgConnection,
    mut row: TurnRow,
    submitted: &Submitted<'_>,
    event: Event,
) -> Result<PendingOutbox, StoreError> {
    let to = transition(Some(row.phase(true)), event)?;
    let approvals = matches!(event, Event::Approvals { .. } | Event::ApprovalExpired);
    sqlx::query!(
        "UPDATE turns SET state = $6, continuation = $3, continuation_fingerprint = $4,
             reply_to = $5, approval_expires_at = NULL,
             pending_tool_calls = CASE WHEN $7 THEN NULL ELSE pending_tool_calls END,
             updated_at = now()
         WHERE session_id = $1 AND turn_id = $2",
        row.session_id,
        &row.turn_id,
        submitted.wire,
        submitted.fingerprint,
        row.reply_to.as_deref(),
        to.column().as_str(),
        approvals
    )
    .execute(&mut *tx)
    .await?;
    row.state = to.column();
    row.continuation = Some(submitted.wire.clone());
    if approvals {
        row.pending_tool_calls = None;
    }
    let start = vec![Outgoing::Start(row.start_job()?)];
    outbox::insert(tx, row.session_id, &row.turn_id, start).await
}
