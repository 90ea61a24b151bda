//! A round trip's ending in one round trip: the common case of [`Store::finish_step`], written
//! by `aptix_finish_at_once` (migration 0030) outside a transaction, where the transaction takes
//! four (BEGIN, the session's lock, the step statement, COMMIT).
//!
//! It applies when the ending needs nothing but the step statement under the session's lock:
//! no budget to settle, no follow-up to take in, no tenant limit to charge tokens or start held
//! turns for (a configured tenant none of whose limits is set has none), and a turn that does
//! not run on. The function checks under the lock what only the database knows (the session's
//! tenant, the turn running this step, no follow-ups taken in, no turn queued behind one that
//! ends) and otherwise writes nothing, so the caller's transaction runs as before.
//!
//! [`Store::finish_step`]: super::Store::finish_step

use sqlx::PgPool;

use super::new_record::PreparedRecord;
use super::outbox::PendingOutbox;
use super::step_end::{FinishStep, StepParams};
use super::StoreError;
use crate::assemble::PackedState;
use crate::messages::Outgoing;

/// Writes an ending (its record, `f` and the session's new state) in one call, with `reply` (the
/// round trip's reply, if it sends one, as yet without the session's name and expiry: the
/// function reads them under the lock and puts them in the reply, kept and returned). `limited`:
/// the turn's tenant has a limit set (its tokens are charged, its held turns started, in the
/// transaction). `None`: nothing was written, and the transaction must run; `reply` is as it was.
pub(super) async fn finish(
    pool: &PgPool,
    (record, f, state): (&PreparedRecord<'_>, &FinishStep, Option<&PackedState>),
    reply: &mut Vec<Outgoing>,
    limited: bool,
) -> Result<Option<PendingOutbox>, StoreError> {
    if limited || f.settle.is_some() || !f.steers_taken_in().is_empty() {
        return Ok(None);
    }
    let p = StepParams::of(f, state, reply.first())?;
    // A turn that runs on starts its next round trip in the transaction.
    if p.state == "running" {
        return Ok(None);
    }
    let session = f.key.session_id.as_uuid();
    // `outbox::with_session_model`'s choice: a step reply to this session is named.
    let named = matches!(reply.first(), Some(Outgoing::Reply(r))
        if r.step.is_some() && r.session.as_uuid() == session);
    let r = record.params();
    let tenant = f.tenant.as_ref().map(|t| t.as_str());
    let row = sqlx::query!(
        r#"SELECT done AS "done!", reply_id, session_name, session_expires
           FROM aptix_finish_at_once($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
               $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30,
               $31, $32, $33, $34, $35, $36, $37, $38, $39)"#,
        r.id,
        r.session,
        r.turn,
        r.step,
        r.kind,
        r.provider_response_id,
        r.chain,
        r.request as _,
        r.response as _,
        r.retrieved_chunks,
        r.active_files,
        r.skipped_files,
        r.usage,
        r.errors,
        r.instruction,
        r.workspace_id,
        r.repo,
        r.language,
        r.rag_scope,
        r.reply,
        r.text_keys,
        r.text_bodies,
        r.stage_timings,
        r.conversation_context_id,
        r.context_versions,
        p.state,
        p.step,
        p.pending,
        p.warnings,
        p.server_calls,
        p.runs_on,
        p.executed,
        p.session_state as _,
        p.ended,
        p.reply,
        p.cancelled,
        p.approval_expires_at,
        tenant,
        named
    )
    .fetch_one(pool)
    .await?;
    if !row.done {
        return Ok(None);
    }
    let mut out = PendingOutbox::default();
    if let (Some(id), Some(mut m)) = (row.reply_id, reply.pop()) {
        if let (true, Outgoing::Reply(r)) = (named, &mut m) {
            (r.session_name, r.session_expires) = (row.session_name, row.session_expires);
        }
        out.ids.push(id);
        out.messages.push(m);
    }
    Ok(Some(out))
}
