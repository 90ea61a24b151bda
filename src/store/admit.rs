//! Admission of user turns: idempotency by `(SessionId, TurnId)`, one turn at a time per
//! session (later turns queue in arrival order). Tool continuations are in `resume`.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::new_record::NewRecord;
use super::new_turn::{
    insert_turn, start_turn, start_turn_at_once, start_turn_if_clear, NewTurn, Start,
};
use super::outbox::{self, PendingOutbox};
pub use super::session_lock::SessionMeta;
use super::session_lock::{open_session, set_mode};
use super::sessions::SessionOwner;
use super::tenants::{self, Gate, Limit};
use super::turn_row::turn_row;
use super::turns::{finished_reply, TurnRow, TurnState};
use super::{Store, StoreError};
use crate::config::{FollowUp, OverLimit};
use crate::contracts::{ApiError, InstanceName, InvokeResult, Reply, TenantName, TurnKey};
use crate::lifecycle::Event;
use crate::llm::RequestBody;
use crate::messages::{Outgoing, ReplyOut};

/// How long after it was written an unpublished reply is left to its persist worker before a new
/// turn of the session publishes it itself: longer than a reconnect and a redelivery take.
const REPLY_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(5);

/// The result of admitting a user turn.
#[derive(Debug)]
pub enum Admission {
    /// A new turn. It runs now (its forward message is in `outbox`) or waits behind the
    /// session's current turn (`outbox` empty).
    Accepted {
        /// Messages to publish.
        outbox: PendingOutbox,
        /// Whether the turn waits behind another.
        queued: bool,
        /// Whether this turn created the session.
        new_session: bool,
    },
    /// The same request was already admitted and has not finished; unpublished messages, if a
    /// crash left any, are in `outbox`.
    InFlight {
        /// Messages to publish.
        outbox: PendingOutbox,
    },
    /// The same request already finished: send the stored reply again.
    Finished {
        /// The stored reply.
        reply: Value,
    },
    /// The pair was used with different content.
    Conflict,
    /// The session is busy with another turn and the turn's mode rejects follow-ups
    /// (`FollowUp::Reject`): nothing written.
    Busy {
        /// The session's active turn.
        turn_id: String,
    },
    /// The turn chose a `FollowUp` its mode does not allow: nothing written.
    FollowUpNotAllowed,
    /// The session waits for tool results of another turn.
    AwaitingToolResults {
        /// The waiting turn.
        turn_id: String,
    },
    /// The session waits for the client's approval of another turn's tool calls.
    AwaitingApproval {
        /// The waiting turn.
        turn_id: String,
    },
    /// The session belongs to another tenant: nothing was read or written.
    Unavailable,
    /// The session holds other contexts than `meta` assumed: nothing written.
    ContextsDiffer(SessionOwner),
    /// The tenant is over this limit (and refuses, or it is a new session): nothing written.
    Limited(Limit),
}

/// Whether a session with `stored` contexts serves a turn that assumed `meta`'s: the same
/// AgentContext, and the session's current mode unless the turn named its own (a session from
/// before contexts were fixed has none, and serves any).
fn contexts_match(stored: &SessionOwner, meta: &SessionMeta) -> bool {
    let same = |s: &Option<String>, m: &Option<String>| s.is_none() || s == m;
    same(&stored.agent_context_id, &meta.agent_context_id)
        && (meta.mode_named || same(&stored.conversation_context_id, &meta.conversation_context_id))
}

/// The record and reply of a turn failed at `row`'s step with `error`, and the reply's message.
pub(super) fn failure(
    row: &TurnRow,
    error: ApiError,
    request_payload: Option<RequestBody>,
    versions: &crate::config::ContextVersions,
) -> Result<(NewRecord, Outgoing), StoreError> {
    let key = row.key()?;
    let reply: Reply =
        InvokeResult::fail(vec![error.clone()]).about(key.session_id, Some(key.turn_id.clone()));
    let out =
        ReplyOut::step(key.session_id, key.turn_id.as_str(), row.step, &reply)?.to(row.address()?);
    let mut record = NewRecord::failure(&[error], out.body.clone(), request_payload)?;
    // A failed turn's record says which mode it ran in, as a completed one's does.
    record.conversation_context_id = row.conversation_context_id();
    // And which versions of its contexts it would have run with.
    let agent = row.request.get("AgentContextId").and_then(serde_json::Value::as_str);
    let conversation = record.conversation_context_id.as_deref();
    record.context_versions = versions.record_by_id(conversation, agent);
    Ok((record, Outgoing::Reply(out)))
}

impl Store {
    /// Admits a validated user turn; a turn that runs now gets its start message in the outbox.
    /// A turn of another tenant's session, or over its tenant's limits, writes nothing. A copy
    /// admitted while this one waited for the session is [`StoreError::AdmittedMeanwhile`]:
    /// admitting again finds it.
    pub async fn admit_user_turn(
        &self,
        key: &TurnKey,
        fingerprint: &str,
        request: &Value,
        meta: &SessionMeta,
        reply_to: Option<&InstanceName>,
    ) -> Result<Admission, StoreError> {
        let (session, turn) = (key.session_id.as_uuid(), key.turn_id.as_str());
        let gate = self.gate(meta.tenant.as_ref().map(TenantName::as_str));
        let new = |seq| NewTurn {
            session,
            turn,
            seq,
            fingerprint,
            request,
            reply_to,
            tenant: meta.tenant.as_ref(),
            expires_at: meta.expires_at,
        };
        // Most turns come to a new or idle session of a tenant without limits: one round trip.
        // The start it built is kept for the transaction's ways to start the turn.
        let (mut start, mut created_at_once) = (None, false);
        let unlimited = !gate.as_ref().is_some_and(Gate::is_limited);
        if unlimited && !meta.follow_up_refused {
            let first = Start::of(&new(0))?;
            let (started, created) = start_turn_at_once(&self.pool, &new(0), meta, first).await?;
            match started {
                Ok(outbox) => {
                    return Ok(Admission::Accepted { outbox, queued: false, new_session: created })
                }
                Err(unused) => (start, created_at_once) = (Some(unused), created),
            }
        }
        let mut tx = self.pool.begin().await?;
        let (locked, created) = open_session(&mut tx, session, turn, meta).await?;
        let created = created || created_at_once;
        if locked.owner.tenant.as_deref() != meta.tenant.as_ref().map(TenantName::as_str) {
            return Ok(Admission::Unavailable);
        }
        if !contexts_match(&locked.owner, meta) {
            return Ok(Admission::ContextsDiffer(locked.owner));
        }
        let existing = if locked.known { turn_row(&mut tx, session, turn).await? } else { None };
        if let Some(existing) = existing {
            let outcome = if existing.fingerprint != fingerprint {
                Admission::Conflict
            } else if existing.state.is_finished() {
                Admission::Finished { reply: finished_reply(&mut tx, &existing).await? }
            } else {
                Admission::InFlight {
                    outbox: outbox::pending_for_turn(&mut tx, session, turn).await?,
                }
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        if meta.follow_up_refused {
            return Ok(Admission::FollowUpNotAllowed);
        }
        let active = match &locked.active_turn_id {
            Some(id) => Some((id.clone(), host_of(&mut tx, session, id).await?)),
            None => None,
        };
        // A steer joins the active turn in that turn's mode: one in another mode (named, or the
        // session's since a queued turn changed it) waits as a turn of its own instead.
        let own_mode = request.get("ConversationContextId").and_then(Value::as_str);
        let follow_up = match (&active, meta.follow_up) {
            (Some((_, host)), FollowUp::Steer) if host.mode.as_deref() != own_mode => {
                FollowUp::Enqueue
            }
            (_, chosen) => chosen,
        };
        let steers = active.is_some() && follow_up == FollowUp::Steer;
        let current = locked.owner.conversation_context_id.as_ref();
        if let Some(mode) = meta.conversation_context_id.as_ref().filter(|m| Some(*m) != current) {
            // A steer leaves the session's mode as it was: it runs in the active turn's.
            if !created && !steers {
                set_mode(&mut tx, session, mode).await?;
            }
        }
        if let Some(gate) = &gate {
            tenants::lock(&mut tx, &gate.tenant).await?;
            if let (true, Err(limit)) = (created, tenants::session_allowed(&mut tx, gate).await?) {
                return Ok(Admission::Limited(limit));
            }
        }
        let new = new(locked.next_seq);
        let queued = |outbox| Admission::Accepted { outbox, queued: true, new_session: created };
        if let Some((active, host)) = active {
            let waiting = matches!(
                host.state,
                Some(TurnState::AwaitingToolResults | TurnState::AwaitingApproval)
            );
            // Refused: nothing is committed, so a mode the turn named is not the session's. A
            // turn that waits for the client's tool results ends only when they come: `busy`
            // would tell the client to wait for something that waits for the client.
            // A steer is for exactly such a turn: it joins the call the results start.
            if waiting && !matches!(follow_up, FollowUp::Interrupt | FollowUp::Steer) {
                if host.state == Some(TurnState::AwaitingApproval) {
                    return Ok(Admission::AwaitingApproval { turn_id: active });
                }
                return Ok(Admission::AwaitingToolResults { turn_id: active });
            }
            if follow_up == FollowUp::Reject {
                return Ok(Admission::Busy { turn_id: active });
            }
            // Refused turns count from admission: this one will start whatever happens.
            if let Some(limit) = refused_by(&mut tx, gate.as_ref(), request).await? {
                return Ok(Admission::Limited(limit));
            }
            // Its tenant's room is decided when it becomes the session's next turn.
            insert_turn(&mut tx, &new, Event::Admitted { busy: true, room: true }).await?;
            if follow_up == FollowUp::Steer {
                super::steer::aim(&mut tx, session, turn, &active).await?;
            }
            let mut outbox = outbox::insert(&mut tx, session, turn, Vec::new()).await?;
            if follow_up == FollowUp::Interrupt {
                let ended = self.interrupt(&mut tx, session, &active, meta).await?;
                outbox.append(ended);
            }
            tx.commit().await?;
            return Ok(queued(outbox));
        }
        // Without a tenant's gate, a session with nothing unpublished starts the turn at once.
        if gate.is_none() {
            let first = start.take().map_or_else(|| Start::of(&new), Ok)?;
            match start_turn_if_clear(&mut tx, &new, first).await? {
                Ok(outbox) => {
                    tx.commit().await?;
                    return Ok(Admission::Accepted { outbox, queued: false, new_session: created });
                }
                Err(unused) => start = Some(unused),
            }
        }
        // The last turn's reply may still be unpublished: this turn must not overtake it. A
        // fresh one is being published by its persist worker (or will be, when its message comes
        // again after a lost publish): waited for a moment here, then the admission is tried
        // again. An older one is published here first.
        let Some(mut outbox) = outbox::stale_for_session(&mut tx, session, REPLY_IN_FLIGHT).await?
        else {
            return Err(StoreError::ReplyInFlight);
        };
        if let Some(gate) = &gate {
            if gate.limits.over_limit == OverLimit::Queue {
                // The session's head, held; the tenant's held turns then start oldest first
                // while there is room, so a newcomer never overtakes an older held turn.
                insert_turn(&mut tx, &new, Event::Admitted { busy: false, room: false }).await?;
                let rows = tenants::start_held(&mut tx, gate).await?;
                let runs = rows.iter().any(|r| r.session_id == session && r.turn_id == turn);
                let started = tenants::start_messages(&mut tx, &rows).await?;
                outbox.append(started);
                tx.commit().await?;
                return Ok(Admission::Accepted { outbox, queued: !runs, new_session: created });
            }
            let estimate = tenants::request_estimate(gate, request);
            if let Err(limit) = tenants::room(&mut tx, gate, 1, estimate).await? {
                return Ok(Admission::Limited(limit));
            }
        }
        let start = start.map_or_else(|| Start::of(&new), Ok)?;
        let started = start_turn(&mut tx, &new, start).await?;
        outbox.append(started);
        tx.commit().await?;
        Ok(Admission::Accepted { outbox, queued: false, new_session: created })
    }
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
struct Host {
    /// Its state (`None`: no such row).
    state: Option<TurnState>,
    /// The mode it runs in.
    mode: Option<String>,
}

async fn host_of(conn: &mut PgConnection, session: Uuid, turn: &str) -> Result<Host, StoreError> {
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
