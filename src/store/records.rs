//! Finishing a round trip: the immutable record, session state, turn transition, reply and
//! next-turn dispatch, in one call when nothing else is needed (`finish_at_once.rs`), else in
//! one transaction.

use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::finish_at_once;
use super::new_record::{record_query, PreparedRecord};
use super::outbox::{self, PendingOutbox};
use super::step_end::{FinishStep, StepParams};
use super::texts::pack;
use super::turns::{start_next, starts, TurnRow, TurnState};
use super::{Store, StoreError};
use crate::assemble::PackedState;
use crate::contracts::TenantName;
use crate::messages::Outgoing;

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
        let mut reply: Vec<Outgoing> = f.reply.take().map(Outgoing::Reply).into_iter().collect();
        let response = f.record.response_payload.take();
        let key = (session, turn, f.step);
        let mut record = PreparedRecord::new(&self.texts, key, &f.record, response)?;
        // The state's new texts go in the record's texts CTE: one insert for both.
        let state = f.session_state.take().map(|mut s| {
            record.texts.absorb(pack(&self.texts, &mut s));
            s
        });
        let limited =
            self.gate(f.tenant.as_ref().map(TenantName::as_str)).is_some_and(|g| g.is_limited());
        let at_once = (&record, &f, state.as_ref());
        if let Some(out) = finish_at_once::finish(&self.pool, at_once, &mut reply, limited).await? {
            self.texts.keep(&record.texts);
            return Ok(Finished::Done(out));
        }
        let mut tx = self.pool.begin().await?;
        // The session's name and expiry, for the reply, are read with the lock.
        let locked = sqlx::query!(
            "SELECT tenant, name, expires_at FROM sessions WHERE id = $1 FOR UPDATE",
            session
        )
        .fetch_one(&mut *tx)
        .await?;
        let (tenant, name, expires) = (locked.tenant, locked.name, locked.expires_at);
        outbox::with_session_model(&mut tx, session, &mut reply, Some((name, expires))).await?;
        let steers = f.steers_taken_in();
        let taken = super::steer::take_in(&mut tx, session, turn, f.step, steers).await?;
        let written = write_step(&mut tx, &record, &f, state.as_ref(), reply.first()).await?;
        let Some(moved) = written else {
            if taken > 0 {
                // Both check the same under the session's lock: not reached.
                return Err(StoreError::Changed { turn: turn.to_owned(), step: f.step });
            }
            return unwritten(tx, session, turn, f.step, f.cancelled).await;
        };
        if let Some(how) = f.settle {
            super::budget::settle(&mut tx, (session, turn, f.step), how).await?;
        }
        let gate = self.gate(tenant.as_deref());
        // Tokens are kept for a tenant's limits to read; a tenant without limits reads none.
        if let Some(g) = gate.as_ref().filter(|g| g.is_limited()) {
            super::tenants::charge_tokens(&mut tx, g.tenant.as_str(), f.record.usage.as_ref())
                .await?;
        }
        let mut out = PendingOutbox::default();
        if let (Some(id), Some(m)) = (moved.reply_id, reply.pop()) {
            out.ids.push(id);
            out.messages.push(m);
        }
        let end = super::steer::host_end(moved.row.phase(false)).filter(|_| moved.steered);
        if let (Some(end), Some(Outgoing::Reply(last))) = (end, out.messages.last()) {
            let body = last.body.clone();
            let steered =
                super::steer::end_taken_in(&mut tx, &self.texts, session, turn, &body, end).await?;
            out.append(steered);
        }
        let starts = match moved.row.state {
            TurnState::Running => vec![Outgoing::Start(moved.row.start_job()?)],
            TurnState::AwaitingToolResults | TurnState::AwaitingApproval => Vec::new(),
            _ => starts(&start_next(&mut tx, session, gate.as_ref(), moved.next_turn).await?)?,
        };
        let started = outbox::insert(&mut tx, session, turn, starts).await?;
        out.append(started);
        tx.commit().await?;
        self.texts.keep(&record.texts);
        Ok(Finished::Done(out))
    }
}

/// What a round trip gets when [`write_step`] wrote nothing because its turn was not running
/// that step, or its cancel was admitted: its record's messages again, a cancel, or a refusal.
async fn unwritten(
    mut tx: Transaction<'_, Postgres>,
    session: Uuid,
    turn: &str,
    step: i32,
    cancelled: bool,
) -> Result<Finished, StoreError> {
    match step_state(&mut tx, session, turn, step).await? {
        StepState::Recorded => {
            let pending = outbox::pending_for_turn(&mut tx, session, turn).await?;
            tx.commit().await?;
            Ok(Finished::Done(pending))
        }
        StepState::Running { cancelled: true } if !cancelled => Ok(Finished::CancelRequested),
        StepState::Running { .. } => Err(StoreError::Changed { turn: turn.to_owned(), step }),
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
/// is not running at that step, and has no record, is refused. Read only when the step's write
/// did not apply, to tell why.
async fn step_state(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    step: i32,
) -> Result<StepState, StoreError> {
    let r = sqlx::query!(
        r#"SELECT EXISTS (SELECT 1 FROM response_records WHERE session_id = $1
                          AND turn_id = $2 AND step = $3 AND reprocess_of IS NULL) AS "recorded!",
                  t.state AS "state?: TurnState", t.step AS "at?",
                  t.cancel_requested_at IS NOT NULL AS "cancelled?"
           FROM (SELECT 1) AS one
           LEFT JOIN turns t ON t.session_id = $1 AND t.turn_id = $2"#,
        session,
        turn,
        step
    )
    .fetch_one(&mut *conn)
    .await?;
    if r.recorded {
        return Ok(StepState::Recorded);
    }
    let current = r.state.zip(r.at);
    match current {
        Some((TurnState::Running, n)) if n == step => {
            Ok(StepState::Running { cancelled: r.cancelled.unwrap_or(false) })
        }
        other => {
            let state =
                other.map_or_else(|| "unknown".to_owned(), |(s, n)| format!("{s} at step {n}"));
            Err(StoreError::NotRunning { turn: turn.to_owned(), step, state })
        }
    }
}

/// What [`write_step`] returns: the turn past its step, the session's next turn if the turn
/// ended, and the reply's outbox row.
struct Moved {
    row: TurnRow,
    next_turn: Option<String>,
    reply_id: Option<i64>,
    /// Follow-ups the turn took in, this round trip or before, wait for it to end.
    steered: bool,
}

/// Writes a round trip's ending; `None` when its turn was not running the step.
///
/// The turn moved past its step, its record, the session's new state (and, when the turn ends,
/// its next turn) and the reply's outbox row, in one statement: one round trip instead of five.
/// The turn's UPDATE is the check: it moves the turn only if it runs this step and no cancel
/// of it was admitted (unless this ending is the cancel), re-checked on the row's newest
/// version; every other CTE writes only if it moved, so a repeat or a refused step writes
/// nothing and returns no row. Sound because a step's record is only ever written in the
/// transaction that moves its turn past that step (here, its copy in migration 0030's
/// `aptix_finish_at_once`, and `fail.rs`'s `end_turn`).
/// The session is locked, so the snapshot the CTEs share holds every queued turn; the turn that
/// moves was running, never queued, whichever version of it the subquery reads.
async fn write_step(
    conn: &mut PgConnection,
    record: &PreparedRecord<'_>,
    f: &FinishStep,
    state: Option<&PackedState>,
    reply: Option<&Outgoing>,
) -> Result<Option<Moved>, StoreError> {
    let p = StepParams::of(f, state, reply)?;
    let row = record_query!(
        query!(
            "WITH moved AS (
                 UPDATE turns SET state = $26, step = $27, pending_tool_calls = $28,
                     last_reply = NULL, pending_warnings = $29, server_calls = $30,
                     server_executions = COALESCE($32, server_executions),
                     continuation = CASE WHEN $31 THEN NULL ELSE continuation END,
                     approval_expires_at = $37, updated_at = now()
                 WHERE session_id = $2 AND turn_id = $3 AND state = 'running' AND step = $4
                     AND (cancel_requested_at IS NULL OR $36::boolean)
                 RETURNING *), ",
            "WHERE EXISTS (SELECT 1 FROM moved)",
            r#",
             handed AS (
                 UPDATE sessions SET updated_at = now(), state = COALESCE($33::json, state),
                     active_turn_id = CASE WHEN $34::boolean THEN (
                         SELECT turn_id FROM turns WHERE session_id = $2 AND state = 'queued'
                         ORDER BY seq LIMIT 1)
                     ELSE active_turn_id END
                 WHERE id = $2 AND ($34 OR $33::json IS NOT NULL) AND EXISTS (SELECT 1 FROM moved)
                 RETURNING active_turn_id),
             replied AS (
                 INSERT INTO outbox (session_id, turn_id, payload)
                 SELECT $2, $3, $35::jsonb WHERE $35::jsonb IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
                 RETURNING id)
             SELECT m.session_id AS "session_id!", m.turn_id AS "turn_id!", m.seq AS "seq!",
                 m.state AS "state!: TurnState", m.fingerprint AS "fingerprint!",
                 m.request AS "request!", m.step AS "step!",
                 m.pending_tool_calls AS "pending_tool_calls: crate::store::turn_row::CallList",
                 m.pending_warnings AS "pending_warnings: crate::store::turn_row::WarningList",
                 m.last_reply, m.continuation, m.continuation_fingerprint,
                 m.reply_to, m.tenant, m.cancel_requested_at,
                 m.server_calls AS "server_calls: crate::store::turn_row::CallList",
                 m.server_executions AS "server_executions: crate::store::turn_row::ExecutionList",
                 (SELECT active_turn_id FROM handed) AS next_turn,
                 (SELECT id FROM replied) AS reply_id,
                 EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND steers = $3
                         AND state = 'steered') AS "steered!"
             FROM moved m"#
        ),
        &record.params(),
        p.state,
        p.step,
        p.pending,
        p.warnings,
        p.server_calls,
        p.runs_on,
        p.executed,
        p.session_state as _,
        p.ended,
        p.reply,
        p.cancelled,
        p.approval_expires_at
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|m| Moved {
        row: TurnRow {
            session_id: m.session_id,
            turn_id: m.turn_id,
            seq: m.seq,
            state: m.state,
            fingerprint: m.fingerprint,
            request: m.request,
            step: m.step,
            pending_tool_calls: m.pending_tool_calls,
            pending_warnings: m.pending_warnings,
            last_reply: m.last_reply,
            continuation: m.continuation,
            continuation_fingerprint: m.continuation_fingerprint,
            reply_to: m.reply_to,
            tenant: m.tenant,
            cancel_requested_at: m.cancel_requested_at,
            server_calls: m.server_calls,
            server_executions: m.server_executions,
        },
        next_turn: m.next_turn,
        reply_id: m.reply_id,
        steered: m.steered,
    }))
}
