//! Finishing a round trip: the immutable record, session state, turn transition, reply and
//! next-turn dispatch in one transaction.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::new_record::{insert_record, NewRecord};
use super::outbox::{self, PendingOutbox};
use super::turns::{dispatch_next_with, starts, TurnRow, TurnState, TURN_COLUMNS};
use super::{KnownTexts, Store, StoreError};
use crate::contracts::TurnKey;
use crate::messages::Outgoing;

/// How a round trip leaves its turn.
#[derive(Debug, Clone)]
pub enum StepOutcome {
    /// A final answer: the turn is done and the session free.
    Completed,
    /// An error reply: the turn is done and the session free.
    Failed,
    /// Tool calls went to the client; the turn holds the session until results come.
    AwaitingToolResults {
        /// The ordered client calls, as JSON.
        pending: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
        /// Server calls of the same answer, run when the client's results come.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
    },
    /// The answer called only server tools: the turn runs on (no reply), starting its next
    /// round trip where they run.
    ServerTools {
        /// The calls to run.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
    },
}

/// Everything persisted when a round trip ends.
#[derive(Debug)]
pub struct FinishStep {
    /// The turn.
    pub key: TurnKey,
    /// Which round trip (0 for the user turn, +1 per continuation).
    pub step: i32,
    /// The immutable record.
    pub record: NewRecord,
    /// The session's new assemble state, when it changed.
    pub session_state: Option<Value>,
    /// Texts the state it was built from referenced: already stored, not sent again.
    pub known_texts: KnownTexts,
    /// The turn's transition.
    pub outcome: StepOutcome,
    /// Messages to publish after the commit (the reply).
    pub messages: Vec<Outgoing>,
    /// Whether it ends the turn as cancelled (its client's cancel was admitted).
    pub cancelled: bool,
}

/// What finishing a round trip did.
#[derive(Debug)]
pub enum Finished {
    /// Committed; its messages (or, for a repeat, the turn's unpublished ones) are here.
    Done(PendingOutbox),
    /// Nothing written: a cancel of the turn was admitted, so the round trip must end as
    /// cancelled instead ([`FinishStep::cancelled`]).
    CancelRequested,
}

impl Store {
    /// Ends a round trip in one transaction. Idempotent: if its record already exists, nothing
    /// changes and the turn's unpublished outbox rows are returned for publishing.
    pub async fn finish_step(&self, mut f: FinishStep) -> Result<Finished, StoreError> {
        let (session, turn) = (f.key.session_id.as_uuid(), f.key.turn_id.as_str());
        let mut tx = self.pool.begin().await?;
        // The session's name and expiry, for the reply, are read with the lock.
        let (tenant, name, expires): (Option<String>, Option<String>, Option<_>) = sqlx::query_as(
            "SELECT tenant, name, expires_at FROM sessions WHERE id = $1 FOR UPDATE",
        )
        .bind(session)
        .fetch_one(&mut *tx)
        .await?;
        match step_state(&mut tx, session, turn, f.step).await? {
            StepState::Recorded => {
                let pending = outbox::pending_for_turn(&mut tx, session, turn).await?;
                tx.commit().await?;
                return Ok(Finished::Done(pending));
            }
            StepState::Running { cancelled: true } if !f.cancelled => {
                return Ok(Finished::CancelRequested);
            }
            StepState::Running { .. } => {}
        }
        let stored =
            insert_record(&mut tx, &self.texts, (session, turn, f.step), &f.record).await?;
        let gate = self.gate(tenant.as_deref());
        if let Some(g) = &gate {
            super::tenants::charge_tokens(&mut tx, g.tenant.as_str(), f.record.usage.as_ref())
                .await?;
        }
        let state = match f.session_state.take() {
            Some(s) => Some(super::texts::pack(&mut tx, &self.texts, s, &f.known_texts).await?),
            None => None,
        };
        let mut messages = std::mem::take(&mut f.messages);
        let after = transition(&mut tx, &f).await?;
        if let (Some(state), false) = (&state, matches!(after, After::Ended)) {
            sqlx::query("UPDATE sessions SET state = $2, updated_at = now() WHERE id = $1")
                .bind(session)
                .bind(state)
                .execute(&mut *tx)
                .await?;
        }
        match after {
            After::Ended => {
                let next = dispatch_next_with(&mut tx, session, gate.as_ref(), state.as_ref());
                messages.extend(starts(&next.await?)?);
            }
            After::Waits => {}
            After::RunsOn(row) => messages.push(Outgoing::Start(row.start_job()?)),
        }
        let model = Some((name, expires));
        let out = outbox::insert_with(&mut tx, session, turn, messages, model).await?;
        tx.commit().await?;
        self.texts.keep(&stored);
        Ok(Finished::Done(out))
    }
}

/// Where a round trip stands when persist offers its ending.
enum StepState {
    /// It already has its record (a redelivered or duplicated persist message).
    Recorded,
    /// The turn runs this step; whether a cancel of it was admitted.
    Running {
        /// A cancel was admitted while it ran.
        cancelled: bool,
    },
}

/// Where round trip `step` stands, in one query (the session is locked); a step for a turn that
/// is not running at that step, and has no record, is refused.
async fn step_state(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    step: i32,
) -> Result<StepState, StoreError> {
    let (recorded, state, at, cancelled): (bool, Option<String>, Option<i32>, Option<bool>) =
        sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM response_records WHERE session_id = $1
                            AND turn_id = $2 AND step = $3 AND reprocess_of IS NULL),
                    t.state, t.step, t.cancel_requested_at IS NOT NULL
             FROM (SELECT 1) AS one
             LEFT JOIN turns t ON t.session_id = $1 AND t.turn_id = $2",
        )
        .bind(session)
        .bind(turn)
        .bind(step)
        .fetch_one(&mut *conn)
        .await?;
    if recorded {
        return Ok(StepState::Recorded);
    }
    let current = match (state, at) {
        (Some(s), Some(n)) => Some((TurnState::try_from(s)?, n)),
        _ => None,
    };
    match current {
        Some((TurnState::Running, n)) if n == step => {
            Ok(StepState::Running { cancelled: cancelled.unwrap_or(false) })
        }
        other => {
            let state =
                other.map_or_else(|| "unknown".to_owned(), |(s, n)| format!("{s} at step {n}"));
            Err(StoreError::NotRunning { turn: turn.to_owned(), step, state })
        }
    }
}

/// What a step's transition leaves to do.
enum After {
    /// The turn ended: the session goes to its next turn.
    Ended,
    /// The turn waits for the client's tool results and keeps the session.
    Waits,
    /// The turn runs on: this is its next round trip's start.
    RunsOn(TurnRow),
}

/// Moves the turn past the step.
async fn transition(conn: &mut PgConnection, f: &FinishStep) -> Result<After, StoreError> {
    let null = Value::Null;
    let (state, pending, warnings, server_calls, executed) = match &f.outcome {
        StepOutcome::Completed => (TurnState::Completed, &null, &null, &null, None),
        StepOutcome::Failed => (TurnState::Failed, &null, &null, &null, None),
        StepOutcome::AwaitingToolResults { pending, warnings, server_calls, executed } => {
            (TurnState::AwaitingToolResults, pending, warnings, server_calls, Some(executed))
        }
        StepOutcome::ServerTools { server_calls, executed, warnings } => {
            (TurnState::Running, &null, warnings, server_calls, Some(executed))
        }
    };
    let runs_on = matches!(f.outcome, StepOutcome::ServerTools { .. });
    let sql = format!(
        "UPDATE turns SET state = $3, step = $4, pending_tool_calls = $5, last_reply = NULL,
             pending_warnings = $6, server_calls = $7,
             server_executions = COALESCE($9, server_executions),
             continuation = CASE WHEN $8 THEN NULL ELSE continuation END, updated_at = now()
         WHERE session_id = $1 AND turn_id = $2 RETURNING {TURN_COLUMNS}"
    );
    let some = |v: &Value| (!v.is_null()).then(|| v.clone());
    let row: TurnRow = sqlx::query_as(&sql)
        .bind(f.key.session_id.as_uuid())
        .bind(f.key.turn_id.as_str())
        .bind(state.as_str())
        .bind(f.step + 1)
        .bind(some(pending))
        .bind(some(warnings))
        .bind(some(server_calls))
        .bind(runs_on)
        .bind(executed.and_then(some))
        .fetch_one(&mut *conn)
        .await?;
    Ok(match state {
        TurnState::Running => After::RunsOn(row),
        TurnState::AwaitingToolResults => After::Waits,
        _ => After::Ended,
    })
}
