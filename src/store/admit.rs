//! Admission of user turns: idempotency by `(SessionId, TurnId)`, one turn at a time per
//! session (later turns queue in arrival order). Here the one-round-trip way and the session's
//! checks; past them, behind a busy session's turn or into an idle one, in `admit_ways`; what
//! it answers in `admission`. Tool continuations are in `resume`.

use serde_json::Value;
use sqlx::PgConnection;

use super::admission::Admission;
use super::admit_ways::{admit_idle, host_of, Admitting, Host};
use super::new_record::NewRecord;
use super::new_turn::{start_turn_at_once, NewTurn, Start};
use super::outbox;
pub use super::session_lock::SessionMeta;
use super::session_lock::{open_session, set_mode};
use super::sessions::SessionOwner;
use super::tenants::{self, Gate};
use super::turn_row::turn_row;
use super::turns::{finished_reply, TurnRow};
use super::{Store, StoreError};
use crate::config::FollowUp;
use crate::contracts::{ApiError, InstanceName, InvokeResult, Reply, TenantName, TurnKey};
use crate::llm::RequestBody;
use crate::messages::{Outgoing, ReplyOut};

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
            let outcome = known_turn(&mut tx, &existing, fingerprint).await?;
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
        let follow_up = follow_up_for(active.as_ref().map(|(_, host)| host), meta, request);
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
        let admitting = Admitting { new: &new, request, meta, gate: gate.as_ref(), created };
        match active {
            Some((active, host)) => {
                self.admit_behind(tx, &admitting, (&active, host), follow_up).await
            }
            None => admit_idle(tx, &admitting, start).await,
        }
    }
}

/// What a copy of `existing` gets: a conflict if its content differs, else the stored reply of
/// a finished turn or the unpublished messages of one in flight.
async fn known_turn(
    conn: &mut PgConnection,
    existing: &TurnRow,
    fingerprint: &str,
) -> Result<Admission, StoreError> {
    Ok(if existing.fingerprint != fingerprint {
        Admission::Conflict
    } else if existing.state.is_finished() {
        Admission::Finished { reply: finished_reply(&mut *conn, existing).await? }
    } else {
        let (session, turn) = (existing.session_id, existing.turn_id.as_str());
        Admission::InFlight { outbox: outbox::pending_for_turn(&mut *conn, session, turn).await? }
    })
}

/// The follow-up choice that applies behind the active turn (`host`): a steer joins it in that
/// turn's mode, so one in another mode (named, or the session's since a queued turn changed
/// it) waits as a turn of its own instead.
fn follow_up_for(host: Option<&Host>, meta: &SessionMeta, request: &Value) -> FollowUp {
    let own_mode = request.get("ConversationContextId").and_then(Value::as_str);
    match (host, meta.follow_up) {
        (Some(host), FollowUp::Steer) if host.mode.as_deref() != own_mode => FollowUp::Enqueue,
        (_, chosen) => chosen,
    }
}
