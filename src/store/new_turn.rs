//! A new user turn as admission writes it: its row, counted on its session, and for a turn
//! that runs now its start message in the outbox, each in one statement; a new or idle
//! session's next turn with its session and lock too, in one round trip.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::session_lock::SessionMeta;
use super::turns::{TurnRow, TurnState};
use super::StoreError;
use crate::contracts::{InstanceName, TenantName};
use crate::lifecycle::{transition, Event};
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

/// A statement that admits a turn, checked at compile time: `$head`'s CTEs, then `counted`
/// (the session's count of the turn, a data-modifying CTE, so it always runs and the count and
/// the insert take one round trip) and `admitted` (the turn's insert), each made only when
/// `$guard` holds, then `$tail`. The turn's parameters are `$1` to `$9` ([`NewTurn`], bound here
/// in order), the statement's own follow as `$extra`.
macro_rules! turn_query {
    ($mac:ident!($head:literal, $guard:literal, $tail:literal), $t:expr, $state:expr
        $(, $extra:expr)* $(,)?) => {{
        let t: &NewTurn<'_> = $t;
        sqlx::$mac!(
            $head
                + "counted AS (
                       UPDATE sessions SET next_seq = next_seq + 1,
                           active_turn_id = COALESCE(active_turn_id, $2),
                           expires_at = GREATEST(expires_at, $9), updated_at = now()
                       WHERE id = $1 AND "
                + $guard
                + "), admitted AS (
                       INSERT INTO turns (session_id, turn_id, seq, state, fingerprint, request,
                           reply_to, tenant, started_at)
                       SELECT $1, $2, $3, $4, $5, $6, $7, $8,
                           CASE WHEN $4 = 'running' THEN clock_timestamp() END
                       WHERE "
                + $guard
                + " RETURNING 1) "
                + $tail,
            t.session,
            t.turn,
            t.seq,
            $state,
            t.fingerprint,
            t.request,
            t.reply_to.map(InstanceName::as_str),
            t.tenant.map(TenantName::as_str),
            t.expires_at
            $(, $extra)*
        )
    }};
}

/// Inserts the turn in the phase its admission (`admitted`, an [`Event::Admitted`]) puts it in,
/// and counts it on its session (the first one holds the session).
pub(super) async fn insert_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    admitted: Event,
) -> Result<TurnRow, StoreError> {
    let phase = transition(None, admitted)?;
    let state = phase.column();
    turn_query!(query!("WITH ", "true", "SELECT 1 AS one FROM admitted"), t, state.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| admitted_meanwhile(e, t.turn))?;
    Ok(t.row(state))
}

/// Inserts a turn that runs now, counted on its session, with its start message in the outbox:
/// one statement. The message is built from the row as written (a new turn starts at step 0
/// with nothing pending), so nothing is read back.
pub(super) async fn start_turn(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    start: Start,
) -> Result<PendingOutbox, StoreError> {
    let id = turn_query!(
        query_scalar!(
            "WITH ",
            "true",
            "INSERT INTO outbox (session_id, turn_id, payload) VALUES ($1, $2, $10) RETURNING id"
        ),
        t,
        start.state.as_str(),
        &start.payload
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| admitted_meanwhile(e, t.turn))?;
    Ok(start.sent_as(id))
}

/// [`start_turn`], done only when no message of the session waits in the outbox (nothing is
/// written otherwise: the start comes back). Most turns start so, and this asks in the round
/// trip that writes. Every CTE sees the rows as they were when the statement began, which, with the
/// session's lock already held, includes every row written under that lock; a row being
/// deleted by its publisher meanwhile only sends the turn the caller's longer way.
pub(super) async fn start_turn_if_clear(
    conn: &mut PgConnection,
    t: &NewTurn<'_>,
    start: Start,
) -> Result<Result<PendingOutbox, Start>, StoreError> {
    let id = turn_query!(
        query_scalar!(
            "WITH clear AS (
                 SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE session_id = $1) AS ok), ",
            "(SELECT ok FROM clear)",
            "INSERT INTO outbox (session_id, turn_id, payload)
             SELECT $1, $2, $10 WHERE (SELECT ok FROM clear) RETURNING id"
        ),
        t,
        start.state.as_str(),
        &start.payload
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| admitted_meanwhile(e, t.turn))?;
    Ok(match id {
        Some(id) => Ok(start.sent_as(id)),
        None => Err(start),
    })
}

/// [`start_turn_if_clear`] for a session that is new, or idle and of the turn's own tenant and
/// contexts (`meta`, already resolved), taking its lock itself: one statement outside a
/// transaction, so one round trip where the transaction takes four, or six for a new session
/// (migration 0029's function, which checks what `Store::admit_user_turn` checks for this case).
/// In any other case no turn is written and the start comes back for the transaction. Whether
/// the call created the session comes with either (it may create it and still not start the
/// turn). The turn's `seq` is not used: the function counts the turn from the locked row.
pub(super) async fn start_turn_at_once(
    pool: &sqlx::PgPool,
    t: &NewTurn<'_>,
    meta: &SessionMeta,
    start: Start,
) -> Result<(Result<PendingOutbox, Start>, bool), StoreError> {
    let row = sqlx::query!(
        "SELECT started, created FROM aptix_admit_at_once($1, $2, $3, $4, $5, $6, $7, $8, $9,
             $10, $11, $12, $13, $14, $15)",
        t.session,
        t.turn,
        start.state.as_str(),
        t.fingerprint,
        t.request,
        t.reply_to.map(InstanceName::as_str),
        t.tenant.map(TenantName::as_str),
        t.expires_at,
        meta.agent_context_id.as_deref(),
        meta.conversation_context_id.as_deref(),
        meta.mode_named,
        &start.payload,
        meta.workspace_id.as_deref(),
        meta.repo.as_deref(),
        meta.name.as_deref()
    )
    .fetch_one(pool)
    .await
    .map_err(|e| admitted_meanwhile(e, t.turn))?;
    let started = match row.started {
        Some(id) => Ok(start.sent_as(id)),
        None => Err(start),
    };
    Ok((started, row.created.unwrap_or(false)))
}

/// A turn that runs now: the state it is written in and its start message, built once per
/// admission (the message does not depend on what the session's lock reads), whichever way
/// writes it.
pub(super) struct Start {
    state: TurnState,
    message: Outgoing,
    /// The message as its outbox row holds it.
    payload: Value,
}

impl Start {
    /// `t`'s start.
    pub(super) fn of(t: &NewTurn<'_>) -> Result<Start, StoreError> {
        let state = transition(None, Event::Admitted { busy: false, room: true })?.column();
        let message = Outgoing::Start(t.row(state).start_job()?);
        let payload = outbox::payload(&message)?;
        Ok(Start { state, message, payload })
    }

    /// The message to publish, written as outbox row `id`.
    fn sent_as(self, id: i64) -> PendingOutbox {
        PendingOutbox { ids: vec![id], messages: vec![self.message] }
    }
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
    /// The row an insert in `state` writes, as it would read back (a new turn is at step 0 with
    /// nothing pending).
    fn row(&self, state: TurnState) -> TurnRow {
        TurnRow {
            session_id: self.session,
            turn_id: self.turn.to_owned(),
            seq: self.seq,
            state,
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
