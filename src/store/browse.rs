//! Reading sessions for the console: a search over ids, names and workspaces within a time
//! window, newest first, and one session's view bounded whatever the session holds.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Store, StoreError};

/// One session in a search result.
#[derive(Debug, Clone, Serialize)]
pub struct SessionSummary {
    /// The SessionId.
    pub id: Uuid,
    /// Its name.
    pub name: Option<String>,
    /// The client's workspace.
    pub workspace_id: Option<String>,
    /// The repository it works in.
    pub repo: Option<String>,
    /// Its tenant, when tenants are configured.
    pub tenant: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The turn running now.
    pub active_turn_id: Option<String>,
    /// How many turns it has had.
    pub turns: i64,
}

/// What to look for.
#[derive(Debug, Clone, Default)]
pub struct SessionSearch {
    /// Part of the name or workspace, or the whole id (case-insensitive); empty: any.
    pub text: String,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// Only this tenant's sessions (a console scoped to one tenant); `None`: every session.
    pub tenant: Option<String>,
    /// Most results.
    pub limit: i64,
}

impl Store {
    /// Sessions matching `search`, newest first.
    pub async fn search_sessions(
        &self,
        search: &SessionSearch,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        // strpos, not LIKE: the text is the user's, and `%` or `_` in it mean themselves.
        Ok(sqlx::query_as!(
            SessionSummary,
            r#"SELECT s.id, s.name, s.workspace_id, s.repo, s.tenant, s.created_at, s.updated_at,
                    s.active_turn_id,
                    (SELECT count(*) FROM turns t WHERE t.session_id = s.id) AS "turns!"
             FROM sessions s
             WHERE ($1 = '' OR s.id::text = lower($1)
                    OR strpos(lower(coalesce(s.name, '')), lower($1)) > 0
                    OR strpos(lower(coalesce(s.workspace_id, '')), lower($1)) > 0)
               AND ($2::timestamptz IS NULL OR s.created_at >= $2)
               AND ($3::timestamptz IS NULL OR s.created_at < $3)
               AND ($5::text IS NULL OR s.tenant = $5)
             ORDER BY s.created_at DESC LIMIT $4"#,
            search.text.trim(),
            search.since,
            search.until,
            search.limit.clamp(1, 1000),
            search.tenant.as_deref()
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

/// Most turns and refusals the console's session and turn pages read of one session.
pub const CONSOLE_ROWS: i64 = 200;

/// Characters of a reply's body the console's session page shows (`aptix session show` prints
/// them whole).
pub const CONSOLE_BODY_CHARS: i32 = 4_096;

impl Store {
    /// A session as the console shows it, whatever the session holds: its newest
    /// [`CONSOLE_ROWS`] turns without their requests, its newest refusals, and for `turn` that
    /// turn's request and its newest [`CONSOLE_ROWS`] records. A client can give one session
    /// any number of turns and refusals of megabytes each; reading them all (as
    /// [`Store::session_view`] does for `aptix session show`) would let it take the console's
    /// memory.
    /// With `tenant`, another tenant's session reads as missing before anything else of it is
    /// read.
    pub async fn console_view(
        &self,
        session: &crate::contracts::SessionId,
        turn: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Option<super::sessions::SessionView>, StoreError> {
        let id = session.as_uuid();
        if let Some(tenant) = tenant {
            let owner = sqlx::query_scalar!("SELECT tenant FROM sessions WHERE id = $1", id)
                .fetch_optional(&self.pool)
                .await?;
            if owner.flatten().as_deref() != Some(tenant) {
                return Ok(None);
            }
        }
        let Some(view) = self.session_row(session).await? else { return Ok(None) };
        // Of the other turns, what the pages show and nothing more: their stored answers,
        // continuations and tool results could be megabytes each.
        let turns = sqlx::query_scalar!(
            r#"SELECT CASE WHEN t.turn_id = $3 THEN to_jsonb(t)
                      ELSE jsonb_build_object('seq', t.seq, 'turn_id', t.turn_id,
                                              'state', t.state, 'step', t.step,
                                              'created_at', t.created_at,
                                              'updated_at', t.updated_at) END
                   AS "row!"
               FROM turns t
               WHERE t.session_id = $1
                 AND (t.turn_id = $3 OR t.seq >= (
                     SELECT min(n.seq) FROM (SELECT seq FROM turns WHERE session_id = $1
                                             ORDER BY seq DESC LIMIT $2) n))
               ORDER BY t.seq"#,
            id,
            CONSOLE_ROWS,
            turn
        )
        .fetch_all(&self.pool)
        .await?;
        // The session page shows no record: only a turn's page reads its own, the newest
        // (reprocessing and evaluation runs add records to a turn without bound).
        let records = match turn {
            Some(turn) => self.session_records(id, Some(turn), Some(CONSOLE_ROWS)).await?,
            None => Vec::new(),
        };
        let replies = self.console_replies(id).await?;
        Ok(Some(super::sessions::SessionView { session: view, turns, records, replies }))
    }

    /// The session's newest [`CONSOLE_ROWS`] replies that no record holds, oldest first, each
    /// cut to [`CONSOLE_BODY_CHARS`] of its body; a reply sent again (a duplicate of a finished
    /// turn, kept by reference) is named, not filled in with the turn's whole answer, which a
    /// client could have sent again hundreds of times.
    async fn console_replies(&self, session: Uuid) -> Result<Vec<Value>, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT jsonb_build_object(
                   'message_id', r.message_id, 'turn_id', r.turn_id, 'outcome', r.outcome,
                   'created_at', r.created_at,
                   'body', CASE WHEN r.resent THEN to_jsonb('the turn''s reply, sent again'::text)
                                WHEN length(r.body::text) > $3
                                THEN to_jsonb(left(r.body::text, $3::int) || '…')
                                ELSE r.body END) AS "row!"
               FROM (SELECT * FROM replies WHERE session_id = $1
                     ORDER BY created_at DESC, message_id DESC LIMIT $2) r
               ORDER BY r.created_at, r.message_id"#,
            session,
            CONSOLE_ROWS,
            CONSOLE_BODY_CHARS
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
