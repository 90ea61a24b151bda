//! Files that server tools produce, kept per owner (the tenant whose turn wrote them) by the
//! SHA-256 of their content: written once (the owner's new write of the same content only
//! extends its expiry), read while they have not expired.

use chrono::{DateTime, Utc};

use super::{Store, StoreError};

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
