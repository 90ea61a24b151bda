//! A new user turn as admission writes it: its row, counted on its session, and for a turn
//! that runs now its start message in the outbox, each in one statement.

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{PgConnection, Postgres};
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::turns::{turn_columns, TurnRow, TurnState};
use super::StoreError;
use crate::contracts::{InstanceName, TenantName};
use crate::messages::Outgoing;

/// A turn to insert.
pub(super) struct NewTurn<'a> {
    pub(super) session: Uuid,
    pub(super) turn: &'a str,
    pub(super) seq: i64,
    pub(super) fingerprint: &'a str,
    pub(super) request: &'a Value,
    pub(super) reply_to: Option<&'a InstanceName>,
    pub(super) tenant: Option<&'a TenantName>,
    pub(super) expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The session's count of a turn inserted with it: a data-modifying CTE (it always runs), so
/// the count and the insert take one round trip.
macro_rules! counted_cte {
    () => {
        "counted AS (
             UPDATE sessions SET next_seq = next_seq + 1,
                 active_turn_id = COALESCE(active_turn_id, $2),
                 expires_at = GREATEST(expires_at, $9), updated_at = now()
             WHERE id = $1)"
    };
}

/// The turn's insert, parameters `$1` to `$9` as [`bind_turn`] binds them.
macro_rules! turn_insert {
    () => {
        "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request, reply_to,
             tenant, started_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
             CASE WHEN $4 = 'running' THEN clock_timestamp() END)"
    };
}

fn bind_turn<'q, O>(
    q: QueryAs<'q, Postgres, O, PgArguments>,
    t: &'q NewTurn<'_>,
    state: TurnState,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    q.bind(t.session)
        .bind(t.turn)
        .bind(t.seq)
        .bind(state.as_str())
        .bind(t.fingerprint)
        .bind(t.request)
        .bind(t.reply_to.map(InstanceName::as_str))
        .bind(t.tenant.map(TenantName::as_str))
        .bind(t.expires_at)
}

/// Inserts the turn in `state` and counts it on its session (the first one holds the session).
pub(super) async fn insert_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    state: TurnState,
) -> Result<TurnRow, StoreError> {
    let sql = concat!("WITH ", counted_cte!(), " ", turn_insert!(), " RETURNING ", turn_columns!());
    let row = bind_turn(sqlx::query_as(sql), t, state).fetch_one(&mut *conn).await;
    row.map_err(|e| admitted_meanwhile(e, t.turn))
}

/// Inserts a turn that runs now, counted on its session, with its start message in the outbox:
/// one statement. The message is built from the row as written (a new turn starts at step 0
/// with nothing pending), so nothing is read back.
pub(super) async fn start_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
) -> Result<PendingOutbox, StoreError> {
    let start = Outgoing::Start(t.running_row().start_job()?);
    let sql = concat!(
        "WITH ",
        counted_cte!(),
        ", admitted AS (",
        turn_insert!(),
        ") INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, $2, $10) RETURNING id"
    );
    let (id,): (i64,) = bind_turn(sqlx::query_as(sql), t, TurnState::Running)
        .bind(outbox::payload(&start)?)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| admitted_meanwhile(e, t.turn))?;
    Ok(PendingOutbox { ids: vec![id], messages: vec![start] })
}

/// `e`, or, when it is the turns' key refusing the insert, [`StoreError::AdmittedMeanwhile`]: a
/// copy of the turn was admitted while this admission waited for the session's lock, which the
/// lock's own look for the turn could not see (`session_lock.rs`).
fn admitted_meanwhile(e: sqlx::Error, turn: &str) -> StoreError {
    match &e {
        sqlx::Error::Database(d) if d.constraint() == Some("turns_pkey") => {
            StoreError::AdmittedMeanwhile { turn: turn.to_owned() }
        }
        _ => StoreError::Db(e),
    }
}

impl NewTurn<'_> {
    /// The row [`start_turn`] writes, as it would read back.
    fn running_row(&self) -> TurnRow {
        TurnRow {
            session_id: self.session,
            turn_id: self.turn.to_owned(),
            seq: self.seq,
            state: TurnState::Running,
            fingerprint: self.fingerprint.to_owned(),
            request: self.request.clone(),
            step: 0,
            pending_tool_calls: None,
            pending_warnings: None,
            last_reply: None,
            continuation: None,
            continuation_fingerprint: None,
            reply_to: self.reply_to.map(|r| r.as_str().to_owned()),
            tenant: self.tenant.map(|t| t.as_str().to_owned()),
            cancel_requested_at: None,
            server_calls: None,
            server_executions: None,
        }
    }
}
