//! Reading sessions for the console: a search over ids, names and workspaces within a time
//! window, newest first.

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
