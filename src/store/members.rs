//! Membership of the validate workers that share the ingress partitions: a heartbeat that also
//! returns who is alive, and leaving on shutdown. Times are the database's, so every worker
//! judges liveness by the same clock.

use std::time::Duration;

use super::{Store, StoreError};

impl Store {
    /// Marks `member` of `group` alive now and returns the group's members seen within
    /// `live_for` (`member` included), sorted.
    pub async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        live_for: Duration,
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query!(
            "INSERT INTO ingress_members (prefix, member) VALUES ($1, $2)
             ON CONFLICT (prefix, member) DO UPDATE SET beat_at = now()",
            group,
            member
        )
        .execute(&self.pool)
        .await?;
        Ok(sqlx::query_scalar!(
            "SELECT member FROM ingress_members
             WHERE prefix = $1 AND beat_at > now() - make_interval(secs => $2) ORDER BY member",
            group,
            live_for.as_secs_f64()
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Removes `member` from `group` (a clean shutdown), and members of `group` not seen for an
    /// hour (crashed ones), so the table stays small.
    pub async fn leave(&self, group: &str, member: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "DELETE FROM ingress_members WHERE prefix = $1
             AND (member = $2 OR beat_at < now() - interval '1 hour')",
            group,
            member
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
