//! Handing a session to its next queued turn, and reading a turn back; the rows themselves and
//! their states are `turn_row`'s.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::tenants::Gate;
use super::{Store, StoreError};
use crate::contracts::TurnKey;
use crate::lifecycle::{transition, Event, Phase};
use crate::messages::Outgoing;

use super::turn_row::query_turns;
pub use super::turn_row::{TurnRow, TurnState};

/// Hands a locked session to its next queued turn and returns the turns that start: that one,
/// or, for a tenant whose turns over a limit are held (`gate` in queue mode), the tenant's
/// held turns its limits now allow, oldest first (the session's next one among them, or held).
pub(super) async fn dispatch_next(
    conn: &mut PgConnection,
    session: Uuid,
    gate: Option<&Gate>,
) -> Result<Vec<TurnRow>, StoreError> {
    // The session's oldest queued turn holds it next (none: it is idle), in one statement.
    let next = sqlx::query_scalar!(
        "UPDATE sessions SET updated_at = now(), active_turn_id = (
             SELECT turn_id FROM turns WHERE session_id = $1 AND state = 'queued'
             ORDER BY seq LIMIT 1)
         WHERE id = $1 RETURNING active_turn_id",
        session
    )
    .fetch_optional(&mut *conn)
    .await?
    .flatten();
    start_next(conn, session, gate, next).await
}

/// Starts what may start once a locked session was handed to `next` (its `active_turn_id`
/// already set): that turn, or the tenant's held turns ([`dispatch_next`]).
pub(super) async fn start_next(
    conn: &mut PgConnection,
    session: Uuid,
    gate: Option<&Gate>,
    next: Option<String>,
) -> Result<Vec<TurnRow>, StoreError> {
    if let Some(gate) = gate.filter(|g| g.limits.over_limit == crate::config::OverLimit::Queue) {
        super::tenants::lock(conn, &gate.tenant).await?;
        return super::tenants::start_held(conn, gate).await;
    }
    let Some(next) = next else { return Ok(Vec::new()) };
    let to = transition(Some(Phase::Queued), Event::Dispatched { room: true })?;
    let q = query_turns!(
        "UPDATE turns SET state = $3, started_at = clock_timestamp(), updated_at = now()
         WHERE session_id = $1 AND turn_id = $2 RETURNING ",
        "",
        session,
        next,
        to.column().as_str()
    );
    Ok(vec![q.fetch_one(&mut *conn).await?])
}

/// The start messages of turns that `dispatch_next` started.
pub(super) fn starts(rows: &[TurnRow]) -> Result<Vec<Outgoing>, StoreError> {
    rows.iter().map(|r| Ok(Outgoing::Start(r.start_job()?))).collect()
}

impl Store {
    /// A turn row.
    pub async fn turn(&self, key: &TurnKey) -> Result<Option<TurnRow>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        super::turn_row::turn_row(&mut conn, key.session_id.as_uuid(), key.turn_id.as_str()).await
    }
}

/// The reply that ended a finished turn, for a client that submits it again: its latest
/// record's. Replies were also copied to `turns.last_reply` before; rows that have one use it.
/// The copy was 0.8 KB of WAL on every turn, for a read that only repeats need.
pub(super) async fn finished_reply(
    conn: &mut PgConnection,
    row: &TurnRow,
) -> Result<Value, StoreError> {
    if let Some(reply) = &row.last_reply {
        return Ok(reply.clone());
    }
    let reply =
        sqlx::query_scalar!("SELECT aptix_turn_reply($1, $2)", row.session_id, &row.turn_id)
            .fetch_one(&mut *conn)
            .await?;
    Ok(reply.unwrap_or(Value::Null))
}
