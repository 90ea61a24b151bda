//! The session's lock as admission takes it: the session created on its first turn, locked,
//! and whether the turn is known, in one statement for a session's later turns.

use sqlx::PgConnection;
use uuid::Uuid;

use super::sessions::SessionOwner;
use super::StoreError;
use crate::contracts::TenantName;

/// Session columns a user turn sets: all of them on the session's first turn; after that only
/// the ConversationContext, when the turn names another one (the session's current mode).
#[derive(Debug, Clone, Default)]
pub struct SessionMeta {
    /// The tenant the session belongs to.
    pub tenant: Option<TenantName>,
    /// Its AgentContext, resolved (the tenant's default when the request named none).
    pub agent_context_id: Option<String>,
    /// The turn's ConversationContext (its mode), resolved likewise.
    pub conversation_context_id: Option<String>,
    /// Whether the turn named its ConversationContext: then it becomes the session's current
    /// one; otherwise the turn must use the session's current one.
    pub mode_named: bool,
    /// Workspace hint.
    pub workspace_id: Option<String>,
    /// Repository hint.
    pub repo: Option<String>,
    /// Display name (from the first turn's instruction).
    pub name: Option<String>,
    /// When the session expires if no other turn comes.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What the turn does if the session is busy with another.
    pub follow_up: crate::config::FollowUp,
    /// The turn chose a `FollowUp` its mode does not allow: refused once it is known to be a new
    /// turn in that mode (a copy of an admitted one is answered as such first).
    pub follow_up_refused: bool,
}

/// A locked session row.
pub(super) struct Locked {
    pub active_turn_id: Option<String>,
    pub next_seq: i64,
    pub owner: SessionOwner,
    /// Whether the turn was admitted before, as the statement's snapshot saw it: taken before
    /// the lock was granted, so a copy admitted while the lock was awaited is missed. The turns'
    /// key catches that copy's insert (`new_turn.rs`); a turn it saw is there.
    pub known: bool,
}

/// Locks the session and tells whether `turn` is known, in one statement.
async fn lock_session(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
) -> Result<Option<Locked>, StoreError> {
    let row = sqlx::query!(
        r#"SELECT active_turn_id, next_seq, tenant, agent_context_id, conversation_context_id,
               EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND turn_id = $2) AS "known!"
           FROM sessions WHERE id = $1 FOR UPDATE"#,
        session,
        turn
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| Locked {
        active_turn_id: r.active_turn_id,
        next_seq: r.next_seq,
        owner: SessionOwner {
            tenant: r.tenant,
            agent_context_id: r.agent_context_id,
            conversation_context_id: r.conversation_context_id,
        },
        known: r.known,
    }))
}

/// Locks the session, creating it first if it is new; whether it was. A session's later turns
/// (nearly all) take one statement: the lock finds the row.
pub(super) async fn open_session(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    meta: &SessionMeta,
) -> Result<(Locked, bool), StoreError> {
    if let Some(locked) = lock_session(conn, session, turn).await? {
        return Ok((locked, false));
    }
    let created = create_session(conn, session, meta).await?;
    let locked = lock_session(conn, session, turn).await?.ok_or(StoreError::Vanished(session))?;
    Ok((locked, created))
}

/// Locks the session; its active turn and tenant (`None`: no such session).
pub(super) async fn lock_active(
    conn: &mut PgConnection,
    session: Uuid,
) -> Result<Option<(Option<String>, Option<String>)>, StoreError> {
    let row = sqlx::query!(
        "SELECT active_turn_id, tenant FROM sessions WHERE id = $1 FOR UPDATE",
        session
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| (r.active_turn_id, r.tenant)))
}

/// Makes `mode` the session's current ConversationContext (a turn that names none uses it).
pub(super) async fn set_mode(
    conn: &mut PgConnection,
    session: Uuid,
    mode: &str,
) -> Result<(), StoreError> {
    sqlx::query!("UPDATE sessions SET conversation_context_id = $2 WHERE id = $1", session, mode)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Creates the session if it is new; whether it was.
async fn create_session(
    conn: &mut PgConnection,
    session: Uuid,
    meta: &SessionMeta,
) -> Result<bool, StoreError> {
    let created = sqlx::query!(
        "INSERT INTO sessions (id, tenant, agent_context_id, conversation_context_id, workspace_id,
             repo, name, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING",
        session,
        meta.tenant.as_ref().map(TenantName::as_str),
        meta.agent_context_id.as_deref(),
        meta.conversation_context_id.as_deref(),
        meta.workspace_id.as_deref(),
        meta.repo.as_deref(),
        meta.name.as_deref(),
        meta.expires_at
    )
    .execute(&mut *conn)
    .await?;
    Ok(created.rows_affected() == 1)
}
