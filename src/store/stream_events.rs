//! Stream deltas kept for `turn.resume` (docs/client-protocol.md §9a), and what a resume sends
//! again: a turn's kept deltas and its stored step replies after a cursor. A delta is written
//! here before it is published, and a step reply is committed with its record before it is, so
//! every event a client could have missed is found here by the time it asks.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{Store, StoreError, TurnState};
use crate::contracts::{event_seq, TenantName, TurnKey};

/// One event a resume sends again.
#[derive(Debug, Clone, PartialEq)]
pub enum Replayed {
    /// A kept delta, its body as it was published.
    Delta {
        /// Its step.
        step: i32,
        /// Its place within the step.
        seq: u64,
        /// The body.
        body: Value,
    },
    /// The reply that ended a step, as stored with the step's record.
    Reply {
        /// The step it ended.
        step: i32,
        /// The body.
        body: Value,
    },
}

impl Replayed {
    /// Its place in the turn (`x-aptix-event-seq`).
    pub fn event_seq(&self) -> i64 {
        match self {
            Replayed::Delta { step, seq, .. } => event_seq(*step, Some(*seq)),
            Replayed::Reply { step, .. } => event_seq(*step, None),
        }
    }
}

/// What a resume of a turn finds.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumeFound {
    /// No such turn in the session (or no such session).
    NotFound,
    /// The session belongs to another tenant.
    Unavailable,
    /// The turn's events after the cursor.
    Events(Resumable),
}

/// A turn's events after a cursor, as one snapshot read them.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumable {
    /// The events, in order.
    pub events: Vec<Replayed>,
    /// Whether its last reply ended it (nothing live comes after these).
    pub ended: bool,
    /// The session's name, which step replies carry as a header.
    pub name: Option<String>,
    /// When the session expires, likewise.
    pub expires: Option<DateTime<Utc>>,
}

/// Steps of a turn whose kept deltas a resume can send again: the current one and those
/// before it. Step replies are all kept (they are the answer); deltas are a preview.
pub const KEPT_STEPS: i32 = 4;

impl Store {
    /// Keeps delta `seq` of `step` of a turn (the caller keeps only a step's first ones). A
    /// step's first delta drops what its session kept of other turns (a session keeps its latest
    /// streamed turn's), of this step and later ones (a call retried streams the step again
    /// from 0: the kept deltas are the last call's), and of steps before its latest
    /// [`KEPT_STEPS`]: a turn of many steps keeps, and a resume sends, a bounded number of deltas.
    pub async fn keep_delta(
        &self,
        key: &TurnKey,
        step: i32,
        seq: u64,
        body: &[u8],
    ) -> Result<(), StoreError> {
        sqlx::query!(
            "WITH gone AS (
                 DELETE FROM stream_events
                 WHERE $5 AND session_id = $1
                   AND (turn_id <> $2 OR event_seq >= $3 OR event_seq < $6)
             )
             INSERT INTO stream_events (session_id, turn_id, event_seq, body)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (session_id, turn_id, event_seq) DO UPDATE SET body = EXCLUDED.body",
            key.session_id.as_uuid(),
            key.turn_id.as_str(),
            event_seq(step, Some(seq)),
            body,
            seq == 0,
            event_seq(step - (KEPT_STEPS - 1), Some(0))
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The events of turn `key` after `after` (all with `None`), for a client of `tenant`.
    pub async fn resume_events(
        &self,
        key: &TurnKey,
        tenant: Option<&TenantName>,
        after: Option<i64>,
    ) -> Result<ResumeFound, StoreError> {
        let (session, turn) = (key.session_id.as_uuid(), key.turn_id.as_str());
        // One snapshot: the turn's state, its deltas and its replies as of one moment.
        let mut tx = self.pool.begin().await?;
        sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let found = sqlx::query!(
            r#"SELECT s.tenant, t.state AS "state?: TurnState", s.name, s.expires_at
               FROM sessions s LEFT JOIN turns t ON t.session_id = s.id AND t.turn_id = $2
               WHERE s.id = $1"#,
            session,
            turn
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(found) = found else {
            return Ok(ResumeFound::NotFound);
        };
        let (owner, state, name, expires) =
            (found.tenant, found.state, found.name, found.expires_at);
        if owner.as_deref() != tenant.map(TenantName::as_str) {
            return Ok(ResumeFound::Unavailable);
        }
        let Some(state) = state else { return Ok(ResumeFound::NotFound) };
        let after = after.unwrap_or(-1);
        let deltas = sqlx::query!(
            "SELECT event_seq, body FROM stream_events
             WHERE session_id = $1 AND turn_id = $2 AND event_seq > $3 ORDER BY event_seq",
            session,
            turn,
            after
        )
        .fetch_all(&mut *tx)
        .await?;
        let replies = sqlx::query!(
            "SELECT step, reply FROM response_records
             WHERE session_id = $1 AND turn_id = $2 AND reprocess_of IS NULL
               AND reply ? 'Successful'
             ORDER BY step",
            session,
            turn
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut events: Vec<Replayed> = deltas
            .into_iter()
            .filter_map(|d| {
                let body: Value = serde_json::from_slice(&d.body).ok()?;
                let step = i32::try_from(d.event_seq / crate::contracts::EVENTS_PER_STEP).ok()?;
                let seq = body.get("Seq").and_then(Value::as_u64)?;
                Some(Replayed::Delta { step, seq, body })
            })
            .chain(replies.into_iter().map(|r| Replayed::Reply { step: r.step, body: r.reply }))
            .filter(|e| e.event_seq() > after)
            .collect();
        events.sort_by_key(Replayed::event_seq);
        let ended = state.is_finished();
        Ok(ResumeFound::Events(Resumable { events, ended, name, expires }))
    }
}
