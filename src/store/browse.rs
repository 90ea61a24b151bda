//! Reading sessions for the console: a search over ids, names and workspaces within a time
//! window, newest first, and one session's view bounded whatever the session holds.

use chrono::{DateTime, Utc};
use serde::Serialize;
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

impl Store {
    /// A session as the console shows it, whatever the session holds: its newest
    /// [`CONSOLE_ROWS`] turns without their requests, its newest refusals, and for `turn` that
    /// turn's request and records. A client can give one session any number of turns and
    /// refusals of megabytes each; reading them all (as [`Store::session_view`] does for
    /// `aptix session show`) would let it take the console's memory.
    pub async fn console_view(
        &self,
        session: &crate::contracts::SessionId,
        turn: Option<&str>,
    ) -> Result<Option<super::sessions::SessionView>, StoreError> {
        let id = session.as_uuid();
        let Some(view) = self.session_row(session).await? else { return Ok(None) };
        let turns = sqlx::query_scalar!(
            r#"SELECT CASE WHEN t.turn_id = $3 THEN to_jsonb(t) ELSE to_jsonb(t) - 'request' END
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
        // The session page shows no record: only a turn's page reads its own.
        let records = match turn {
            Some(turn) => self.session_records(id, Some(turn)).await?,
            None => Vec::new(),
        };
        let replies = self.session_replies(id, Some(CONSOLE_ROWS)).await?;
        Ok(Some(super::sessions::SessionView { session: view, turns, records, replies }))
    }
}
