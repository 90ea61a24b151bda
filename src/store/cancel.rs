//! Cancelling a turn (`turn.cancel`), under its session's lock: a turn that is in no stage
//! (queued, held, awaiting tool results) ends now; a running one is marked, and ends as
//! cancelled at its next stage boundary (invoke aborts its provider call, persist writes the
//! ending). The mark is never cleared, so a redelivered message cannot resurrect the turn.

use super::outbox::PendingOutbox;
use super::turn_row::turn_row;
use super::turns::TurnState;
use super::{Store, StoreError};
use crate::contracts::{ApiError, ErrorCode, TenantName, TurnKey};
use crate::lifecycle::{transition, Event, Phase};

/// What a cancel did.
#[derive(Debug)]
pub enum CancelAdmission {
    /// The turn was in no stage and ended now: its record and reply (and the session's next
    /// turn) are in `outbox`.
    Ended {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The turn is in a stage: it ends as cancelled at its next stage boundary.
    Requested,
    /// A cancel of this turn was admitted before: nothing more happens, except that what that
    /// cancel committed and did not get to publish (a crash in between) is in `outbox`.
    AlreadyCancelled {
        /// Unpublished messages of the turn.
        outbox: PendingOutbox,
    },
    /// No such turn in this session (or no such session).
    NotFound,
    /// The turn had already ended.
    Finished {
        /// How.
        state: TurnState,
    },
    /// The session is another tenant's: nothing was read or written.
    Unavailable,
}

/// Marks a running turn cancelled: it ends as cancelled at its next stage boundary.
async fn mark_cancel(
    conn: &mut sqlx::PgConnection,
    session: uuid::Uuid,
    turn: &str,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE turns SET cancel_requested_at = clock_timestamp(), updated_at = now()
         WHERE session_id = $1 AND turn_id = $2",
        session,
        turn
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The error a cancelled turn ends with.
pub fn cancelled(by: &str) -> ApiError {
    ApiError::new(ErrorCode::TurnCancelled, format!("the turn was cancelled {by}"))
}

impl Store {
    /// Cancels turn `key` for a client of `tenant`.
    pub async fn cancel_turn(
        &self,
        key: &TurnKey,
        tenant: Option<&TenantName>,
    ) -> Result<CancelAdmission, StoreError> {
        let (session, turn) = (key.session_id.as_uuid(), key.turn_id.as_str());
        let mut tx = self.pool.begin().await?;
        let locked = super::session_lock::lock_active(&mut tx, session).await?;
        let Some((active, owner)) = locked else { return Ok(CancelAdmission::NotFound) };
        if owner.as_deref() != tenant.map(TenantName::as_str) {
            return Ok(CancelAdmission::Unavailable);
        }
        let Some(row) = turn_row(&mut tx, session, turn).await? else {
            return Ok(CancelAdmission::NotFound);
        };
        if row.cancel_requested_at.is_some() {
            let outbox = super::outbox::pending_for_turn(&mut tx, session, turn).await?;
            tx.commit().await?;
            return Ok(CancelAdmission::AlreadyCancelled { outbox });
        }
        let active = active.as_deref() == Some(turn);
        let outcome = match transition(Some(row.phase(active)), Event::Cancel) {
            Err(_) => CancelAdmission::Finished { state: row.state },
            Ok(Phase::Running { .. }) => {
                mark_cancel(&mut tx, session, turn).await?;
                CancelAdmission::Requested
            }
            Ok(_) => {
                let error = cancelled("before it ran to its end");
                let outbox = self.end_turn(&mut tx, &row, active, owner.as_deref(), error).await?;
                CancelAdmission::Ended { outbox }
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Cancels the session's `active` turn for a follow-up turn of a mode that interrupts
    /// (`FollowUp::Interrupt`), under the session's lock the admission holds: a running turn
    /// is marked (it ends as cancelled at its next stage boundary, keeping what it streamed);
    /// one in no stage ends now, and its record, reply and the session's next turn are
    /// returned. A turn already cancelling, or ended, is left as it is.
    pub(super) async fn interrupt(
        &self,
        tx: &mut sqlx::PgConnection,
        session: uuid::Uuid,
        active: &str,
        meta: &super::session_lock::SessionMeta,
    ) -> Result<PendingOutbox, StoreError> {
        let Some(row) = turn_row(&mut *tx, session, active).await? else {
            return Ok(PendingOutbox::default());
        };
        match transition(Some(row.phase(true)), Event::Cancel) {
            Err(_) => Ok(PendingOutbox::default()),
            Ok(Phase::Running { .. }) => {
                mark_cancel(tx, session, active).await?;
                Ok(PendingOutbox::default())
            }
            Ok(_) => {
                let tenant = meta.tenant.as_ref().map(TenantName::as_str);
                self.end_turn(tx, &row, true, tenant, cancelled("by a follow-up turn")).await
            }
        }
    }

    /// The running turns among `keys` whose cancel was admitted (an invoke worker asks for the
    /// calls it holds).
    pub async fn cancel_requested(&self, keys: &[TurnKey]) -> Result<Vec<TurnKey>, StoreError> {
        let sessions: Vec<uuid::Uuid> = keys.iter().map(|k| k.session_id.as_uuid()).collect();
        let turns: Vec<&str> = keys.iter().map(|k| k.turn_id.as_str()).collect();
        // Not checked at compile time: the macros cannot make a statement one-shot.
        let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as(
            "SELECT t.session_id, t.turn_id FROM turns t
             JOIN unnest($1::uuid[], $2::text[]) AS k(session_id, turn_id)
               ON t.session_id = k.session_id AND t.turn_id = k.turn_id
             WHERE t.cancel_requested_at IS NOT NULL",
        )
        // Planned with the keys each time: a generic plan made while `turns` was small joined by
        // scanning the whole table, and kept doing so as it grew (see store/sweep.rs).
        .persistent(false)
        .bind(&sessions)
        .bind(&turns)
        .fetch_all(&self.pool)
        .await?;
        Ok(keys
            .iter()
            .filter(|k| {
                rows.iter().any(|(s, t)| *s == k.session_id.as_uuid() && t == k.turn_id.as_str())
            })
            .cloned()
            .collect())
    }
}
