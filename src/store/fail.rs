//! Ending admitted turns from outside their stages.

use sqlx::PgConnection;

use super::admit::failure;
use super::new_record::insert_record;
use super::outbox::{self, PendingOutbox};
use super::turn_row::turn_row;
use super::turns::{dispatch_next, starts, TurnRow, TurnState};
use super::{Store, StoreError};
use crate::contracts::{ApiError, ErrorCode, TurnKey};
use crate::lifecycle::{transition, Event};

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
        let locked = super::session_lock::lock_active(&mut tx, session).await?;
        // A session swept away since holds no open turn; a missing row is the same on every try.
        let Some((active, tenant)) = locked else { return Ok(None) };
        let Some(row) = turn_row(&mut tx, session, turn).await? else { return Ok(None) };
        let ours = row.fingerprint == fingerprint
            || row.continuation_fingerprint.as_deref() == Some(fingerprint);
        if !ours || row.state.is_finished() {
            return Ok(None);
        }
        if row.state == TurnState::Steered {
            // It ends with the turn it steered, which sends its one reply: nothing to send now.
            return Ok(Some(PendingOutbox::default()));
        }
        let active = active.as_deref() == Some(turn);
        let out = self.end_turn(&mut tx, &row, active, tenant.as_deref(), error).await?;
        tx.commit().await?;
        Ok(Some(out))
    }

    /// Ends a turn that is not in a stage (or whose stage message can never be handled) with
    /// `error`, under its session's lock: its record, its reply and, when it was the session's
    /// `active` turn (running, awaiting, or held over a tenant's limit), the session's next
    /// turn; a turn queued behind another was never the active one.
    pub(super) async fn end_turn(
        &self,
        tx: &mut PgConnection,
        row: &TurnRow,
        active: bool,
        tenant: Option<&str>,
        error: ApiError,
    ) -> Result<PendingOutbox, StoreError> {
        let (session, turn) = (row.session_id, row.turn_id.as_str());
        let cancelled = error.code == ErrorCode::TurnCancelled;
        let event = if cancelled { Event::Cancel } else { Event::GivenUp };
        let to = transition(Some(row.phase(active)), event)?;
        let (mut record, reply) = failure(row, error, None, &self.versions)?;
        if cancelled {
            record.kind = "cancelled".into();
        }
        insert_record(&mut *tx, &self.texts, (session, turn, row.step), &record).await?;
        sqlx::query!(
            "UPDATE turns SET state = $4, step = step + 1, pending_tool_calls = NULL, last_reply = NULL,
                 cancel_requested_at = CASE WHEN $3
                     THEN COALESCE(cancel_requested_at, clock_timestamp()) END,
                 updated_at = now()
             WHERE session_id = $1 AND turn_id = $2",
            session,
            turn,
            to.cancel_marked(),
            to.column().as_str()
        )
        .execute(&mut *tx)
        .await?;
        // The turn's reply, then those of the follow-ups it took in, then the next turn's start.
        let mut out = super::steer::ending(&mut *tx, &self.texts, session, turn, reply, to).await?;
        if active {
            let gate = self.gate(tenant);
            let next = starts(&dispatch_next(&mut *tx, session, gate.as_ref()).await?)?;
            out.append(outbox::insert(&mut *tx, session, turn, next).await?);
        }
        Ok(out)
    }
}
