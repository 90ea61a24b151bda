//! Admission's two ways past the session's checks, under its lock: behind the active turn of a
//! busy session (queued, steering, interrupting, or refused), or into an idle one (started now,
//! after the session's older unpublished replies, held or refused by its tenant's limits, or
//! tried again later while a fresh reply is being published). Also what admission reads of the
//! active turn to choose between them ([`Host`]).

use serde_json::Value;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::admission::Admission;
use super::new_turn::{insert_turn, start_turn, start_turn_if_clear, NewTurn, Start};
use super::outbox;
use super::session_lock::SessionMeta;
use super::tenants::{self, Gate, Limit};
use super::turns::TurnState;
use super::{Store, StoreError};
use crate::config::{FollowUp, OverLimit};
use crate::lifecycle::Event;

/// How long after it was written an unpublished reply is left to its persist worker before a new
/// turn of the session publishes it itself: longer than a reconnect and a redelivery take.
const REPLY_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(5);

/// Most turns one session holds waiting behind its active turn (queued, or steering it).
pub const MAX_QUEUED_PER_SESSION: i64 = 256;

/// How many of `session`'s turns wait behind its active turn `active` (itself queued when its
/// tenant holds it): queued, or taken into it as steers (a steered row waits for its host's end,
/// which copies the host's reply to each) unless `steered` is false (an interrupt ends them),
/// counted up to [`MAX_QUEUED_PER_SESSION`].
async fn queued_behind(
    conn: &mut PgConnection,
    session: Uuid,
    active: &str,
    steered: bool,
) -> Result<i64, StoreError> {
    let n = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM (SELECT 1 FROM turns
               WHERE session_id = $1 AND turn_id <> $3
                 AND (state = 'queued' OR ($4 AND state = 'steered'))
               LIMIT $2) q"#,
        session,
        MAX_QUEUED_PER_SESSION,
        active,
        steered
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n)
}

impl Store {
    /// Admits `a` behind the session's active turn `active` (`host`: its state and mode), as
    /// `follow_up` decides: queued, steering it, or interrupting it; refused when that turn
    /// waits for the client, by `follow_up` itself, or by its tenant's limits.
    pub(super) async fn admit_behind(
        &self,
        mut tx: Transaction<'_, Postgres>,
        a: &Admitting<'_>,
        (active, host): (&str, Host),
        follow_up: FollowUp,
    ) -> Result<Admission, StoreError> {
        let (session, turn) = (a.new.session, a.new.turn);
        let waiting = matches!(
            host.state,
            Some(TurnState::AwaitingToolResults | TurnState::AwaitingApproval)
        );
        // Refused: nothing is committed, so a mode the turn named is not the session's. A
        // turn that waits for the client's tool results ends only when they come: `busy`
        // would tell the client to wait for something that waits for the client.
        // A steer is for exactly such a turn: it joins the call the results start.
        if waiting && !matches!(follow_up, FollowUp::Interrupt | FollowUp::Steer) {
            let turn_id = active.to_owned();
            if host.state == Some(TurnState::AwaitingApproval) {
                return Ok(Admission::AwaitingApproval { turn_id });
            }
            return Ok(Admission::AwaitingToolResults { turn_id });
        }
        if follow_up == FollowUp::Reject {
            return Ok(Admission::Busy { turn_id: active.to_owned() });
        }
        // Turns waiting behind a turn that waits for the client (or runs long) are rows no
        // limit counts in `queue` mode, nor at all without limits: a session's queue is bounded.
        let steered = follow_up != FollowUp::Interrupt;
        if queued_behind(&mut tx, session, active, steered).await? >= MAX_QUEUED_PER_SESSION {
            return Ok(Admission::QueueFull { turn_id: active.to_owned() });
        }
        // Refused turns count from admission: this one will start whatever happens.
        if let Some(limit) = refused_by(&mut tx, a.gate, a.request).await? {
            return Ok(Admission::Limited(limit));
        }
        // Its tenant's room is decided when it becomes the session's next turn.
        insert_turn(&mut tx, a.new, Event::Admitted { busy: true, room: true }).await?;
        if follow_up == FollowUp::Steer {
            super::steer::aim(&mut tx, session, turn, active).await?;
        }
        let mut outbox = outbox::insert(&mut tx, session, turn, Vec::new()).await?;
        if follow_up == FollowUp::Interrupt {
            let ended = self.interrupt(&mut tx, session, active, a.meta).await?;
            outbox.append(ended);
        }
        tx.commit().await?;
        Ok(Admission::Accepted { outbox, queued: true, new_session: a.created })
    }
}

/// A new turn on its way in, past the checks of its session (locked in the transaction).
pub(super) struct Admitting<'a> {
    /// The turn as it is inserted, at the session's next place.
    pub(super) new: &'a NewTurn<'a>,
    pub(super) request: &'a Value,
    pub(super) meta: &'a SessionMeta,
    pub(super) gate: Option<&'a Gate>,
    /// Whether this admission created the session.
    pub(super) created: bool,
}

/// Admits `a` into its idle session: started now unless its tenant's limits hold or refuse
/// it, after the session's older unpublished replies (published first); a reply written in the
/// last [`REPLY_IN_FLIGHT`] is left to its writer, and the admission fails as
/// [`StoreError::ReplyInFlight`], to be tried again. `start`: the start message already built,
/// if the one-round-trip way built one.
pub(super) async fn admit_idle(
    mut tx: Transaction<'_, Postgres>,
    a: &Admitting<'_>,
    mut start: Option<Start>,
) -> Result<Admission, StoreError> {
    let (new, created) = (a.new, a.created);
    // Without a tenant's gate, a session with nothing unpublished starts the turn at once.
    if a.gate.is_none() {
        let first = start.take().map_or_else(|| Start::of(new), Ok)?;
        match start_turn_if_clear(&mut tx, new, first).await? {
            Ok(outbox) => {
                tx.commit().await?;
                return Ok(Admission::Accepted { outbox, queued: false, new_session: created });
            }
            Err(unused) => start = Some(unused),
        }
    }
    // The last turn's reply may still be unpublished: this turn must not overtake it. A fresh
    // one is being published by its persist worker (or will be, when its message comes again
    // after a lost publish): waited for a moment here, then the admission is tried again. An
    // older one is published here first.
    let Some(mut outbox) = outbox::stale_for_session(&mut tx, new.session, REPLY_IN_FLIGHT).await?
    else {
        return Err(StoreError::ReplyInFlight);
    };
    if let Some(gate) = a.gate {
        if gate.limits.over_limit == OverLimit::Queue {
            // The session's head, held; the tenant's held turns then start oldest first
            // while there is room, so a newcomer never overtakes an older held turn.
            insert_turn(&mut tx, new, Event::Admitted { busy: false, room: false }).await?;
            let rows = tenants::start_held(&mut tx, gate).await?;
            let runs = rows.iter().any(|r| r.session_id == new.session && r.turn_id == new.turn);
            let started = tenants::start_messages(&mut tx, &rows).await?;
            outbox.append(started);
            tx.commit().await?;
            return Ok(Admission::Accepted { outbox, queued: !runs, new_session: created });
        }
        let estimate = tenants::request_estimate(gate, a.request);
        if let Err(limit) = tenants::room(&mut tx, gate, 1, estimate).await? {
            return Ok(Admission::Limited(limit));
        }
    }
    let start = start.map_or_else(|| Start::of(new), Ok)?;
    let started = start_turn(&mut tx, new, start).await?;
    outbox.append(started);
    tx.commit().await?;
    Ok(Admission::Accepted { outbox, queued: false, new_session: created })
}

/// The limit that refuses one more turn, for a tenant that refuses (the lock is held).
async fn refused_by(
    conn: &mut PgConnection,
    gate: Option<&Gate>,
    request: &serde_json::Value,
) -> Result<Option<Limit>, StoreError> {
    match gate {
        Some(g) if g.limits.over_limit == OverLimit::Refuse => {
            let estimate = tenants::request_estimate(g, request);
            Ok(tenants::room(conn, g, 1, estimate).await?.err())
        }
        _ => Ok(None),
    }
}

/// What admission needs of the session's active turn.
pub(super) struct Host {
    /// Its state (`None`: no such row).
    pub(super) state: Option<TurnState>,
    /// The mode it runs in.
    pub(super) mode: Option<String>,
}

/// The state and mode of `session`'s turn `turn` (none of either if it has no row).
pub(super) async fn host_of(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<Host, StoreError> {
    let row = sqlx::query!(
        r#"SELECT state AS "state: TurnState", request->>'ConversationContextId' AS mode
           FROM turns WHERE session_id = $1 AND turn_id = $2"#,
        session,
        turn
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match row {
        Some(r) => Host { state: Some(r.state), mode: r.mode },
        None => Host { state: None, mode: None },
    })
}
