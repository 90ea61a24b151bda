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
use crate::lifecycle::{transition, Event, Phase};
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
/// the count and the insert take one round trip. `$guard` is a `WHERE` clause's condition; the
/// count, like the insert, is made only when it holds.
macro_rules! counted_cte {
    ($guard:literal) => {
        concat!(
            "counted AS (
             UPDATE sessions SET next_seq = next_seq + 1,
                 active_turn_id = COALESCE(active_turn_id, $2),
                 expires_at = GREATEST(expires_at, $9), updated_at = now()
             WHERE id = $1 AND ",
            $guard,
            ")"
        )
    };
}

/// The turn's insert, parameters `$1` to `$9` as [`bind_turn`] binds them, made only when
/// `$guard` holds.
macro_rules! turn_insert {
    ($guard:literal) => {
        concat!(
            "INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request, reply_to,
                 tenant, started_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8,
                 CASE WHEN $4 = 'running' THEN clock_timestamp() END
             WHERE ",
            $guard
        )
    };
}

fn bind_turn<'q, O>(
    q: QueryAs<'q, Postgres, O, PgArguments>,
    t: &'q NewTurn<'_>,
    phase: Phase,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    q.bind(t.session)
        .bind(t.turn)
        .bind(t.seq)
        .bind(phase.column().as_str())
        .bind(t.fingerprint)
        .bind(t.request)
        .bind(t.reply_to.map(InstanceName::as_str))
        .bind(t.tenant.map(TenantName::as_str))
        .bind(t.expires_at)
}

/// Inserts the turn in the phase its admission (`admitted`, an [`Event::Admitted`]) puts it in,
/// and counts it on its session (the first one holds the session).
pub(super) async fn insert_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    admitted: Event,
) -> Result<TurnRow, StoreError> {
    let phase = transition(None, admitted)?;
    let sql = concat!(
        "WITH ",
        counted_cte!("true"),
        " ",
        turn_insert!("true"),
        " RETURNING ",
        turn_columns!()
    );
    let row = bind_turn(sqlx::query_as(sql), t, phase).fetch_one(&mut *conn).await;
    row.map_err(|e| admitted_meanwhile(e, t.turn))
}

/// Inserts a turn that runs now, counted on its session, with its start message in the outbox:
/// one statement. The message is built from the row as written (a new turn starts at step 0
/// with nothing pending), so nothing is read back.
pub(super) async fn start_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
) -> Result<PendingOutbox, StoreError> {
    let sql = concat!(
        "WITH ",
        counted_cte!("true"),
        ", admitted AS (",
        turn_insert!("true"),
        ") INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, $2, $10) RETURNING id"
    );
    // Unguarded, the insert returns its row, as `fetch_one` would insist.
    start_with(conn, t, sql).await?.ok_or(StoreError::Db(sqlx::Error::RowNotFound))
}

/// [`start_turn`], done only when no message of the session waits in the outbox (nothing is
/// written otherwise: `None`). Most turns start so, and this asks in the round trip that
/// writes. Every CTE sees the rows as they were when the statement began, which, with the
/// session's lock already held, includes every row written under that lock; a row being
/// deleted by its publisher meanwhile only sends the turn the caller's longer way.
pub(super) async fn start_turn_if_clear(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
) -> Result<Option<PendingOutbox>, StoreError> {
    let sql = concat!(
        "WITH clear AS (SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE session_id = $1) AS ok), ",
        counted_cte!("(SELECT ok FROM clear)"),
        ", admitted AS (",
        turn_insert!("(SELECT ok FROM clear)"),
        ") INSERT INTO outbox (session_id, turn_id, payload)
         SELECT $1, $2, $10 WHERE (SELECT ok FROM clear) RETURNING id"
    );
    start_with(conn, t, sql).await
}

async fn start_with(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    sql: &'static str,
) -> Result<Option<PendingOutbox>, StoreError> {
    let runs = transition(None, Event::Admitted { busy: false, room: true })?;
    let start = Outgoing::Start(t.running_row().start_job()?);
    let id: Option<(i64,)> = bind_turn(sqlx::query_as(sql), t, runs)
        .bind(outbox::payload(&start)?)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| admitted_meanwhile(e, t.turn))?;
    Ok(id.map(|(id,)| PendingOutbox { ids: vec![id], messages: vec![start] }))
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
