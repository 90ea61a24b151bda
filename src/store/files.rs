//! Files that server tools produce, kept per owner (the tenant whose turn wrote them) by the
//! SHA-256 of their content: written once (the owner's new write of the same content only
//! extends its expiry), read while they have not expired, and deleted an hour after.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

/// How long after it expired a file is deleted at the earliest: a request for it that started
/// just before it expired is still answered.
pub const FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// A stored file's content address, and until when it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptFile {
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// When it stops being served (the latest of every write's expiry).
    pub expires_at: DateTime<Utc>,
}

impl Store {
    /// Keeps `content` for `owner` (a tenant's name, `""` without tenants) until at least
    /// `expires_at`.
    pub async fn put_file(
        &self,
        owner: &str,
        content: &[u8],
        expires_at: DateTime<Utc>,
    ) -> Result<KeptFile, StoreError> {
        let sha256 = crate::assemble::sha256_hex(content);
        let size = i64::try_from(content.len()).unwrap_or(i64::MAX);
        let expires_at = sqlx::query_scalar!(
            "INSERT INTO files (owner, sha256, content, size_bytes, expires_at)
             VALUES ($5, $1, $2, $3, $4)
             ON CONFLICT (owner, sha256) DO UPDATE
                 SET expires_at = GREATEST(files.expires_at, EXCLUDED.expires_at)
             RETURNING expires_at",
            &sha256,
            content,
            size,
            expires_at,
            owner
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(KeptFile { sha256, size_bytes: content.len() as u64, expires_at })
    }

    /// Deletes up to `batch` files that expired more than [`FILE_GRACE`] ago (another worker's
    /// rows being deleted are passed over); how many went. A file is served until it expires,
    /// and kept an hour past that at most (once a sweep ran): server tools write as many as
    /// the model asks for.
    pub async fn delete_expired_files(&self, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM files WHERE (owner, sha256) IN (
                 SELECT owner, sha256 FROM files
                 WHERE expires_at < now() - make_interval(secs => $2)
                 LIMIT $1 FOR UPDATE SKIP LOCKED)",
            i64::from(batch),
            FILE_GRACE.as_secs_f64()
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// The content `owner` stored under `sha256`, unless it expired or never existed.
    pub async fn file(&self, owner: &str, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(sqlx::query_scalar!(
            "SELECT content FROM files WHERE owner = $1 AND sha256 = $2 AND expires_at > now()",
            owner,
            sha256
        )
        .fetch_optional(&self.pool)
        .await?)
    }
}
