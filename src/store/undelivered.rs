//! Replies waiting for their client's queue: parked by the stage whose publish the queue
//! refused, claimed and offered again by the redelivery loop, oldest first per queue so a
//! session's replies still arrive in order.

use std::time::Duration;

use uuid::Uuid;

use super::{Store, StoreError};

/// Parked replies one session's queue may hold; past it, a refused reply is not parked (it
/// stays in PostgreSQL with its turn's record or in `replies`, where `aptix session show` reads
/// it). An instance's queue (client protocol §4a), which serves many sessions, may hold its
/// tenant's whole [`MAX_PARKED_PER_TENANT`].
pub const MAX_PARKED_PER_QUEUE: i64 = 1_000;
/// Parked replies one tenant's queues may hold together (all of a single-tenant deployment's),
/// so that a tenant with many refusing queues cannot make the table grow without bound.
pub const MAX_PARKED_PER_TENANT: i64 = 10_000;

/// A reply to park.
#[derive(Debug, Clone)]
pub struct ParkReply {
    /// The client's queue that refused it.
    pub queue: String,
    /// The session it belongs to, when it names one.
    pub session: Option<Uuid>,
    /// The tenant whose queue it is.
    pub tenant: Option<String>,
    /// Whether the queue is a backend instance's (many sessions'), not one session's.
    pub instance: bool,
    /// The reply as the broker module publishes it.
    pub message: serde_json::Value,
    /// Why the queue did not take it.
    pub reason: String,
}

/// A parked reply claimed for one more offer.
#[derive(Debug, Clone)]
pub struct Parked {
    /// Row id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// The tenant whose queue it is.
    pub tenant: Option<String>,
    /// The reply.
    pub message: serde_json::Value,
    /// Offers made before this one.
    pub tries: i32,
    /// How long it has waited.
    pub age: Duration,
}

/// How long a claimed reply is left to its claimer before another process may offer it.
const CLAIM: Duration = Duration::from_secs(30);

impl Store {
    /// Parks `replies`; returns how many were not parked because their queue holds
    /// [`MAX_PARKED_PER_QUEUE`] already, or their tenant [`MAX_PARKED_PER_TENANT`]. A reply
    /// parked already for its queue (same `message_id`: a delivery handled again) is not parked
    /// twice.
    pub async fn park_replies(&self, replies: &[ParkReply]) -> Result<usize, StoreError> {
        let mut over = 0;
        let mut tx = self.pool.begin().await?;
        for r in replies {
            let room = sqlx::query_scalar!(
                // Each count stops at its bound, on an index (`undelivered_queue`,
                // `undelivered_tenant`): a refusal costs at most the bound's rows to count.
                r#"WITH room AS (
                       SELECT (SELECT count(*) FROM (SELECT 1 FROM undelivered
                                                     WHERE queue = $1 LIMIT $6) q) < $6
                          AND (SELECT count(*) FROM (SELECT 1 FROM undelivered
                                                     WHERE coalesce(tenant, '') = coalesce($3, '')
                                                     LIMIT $7) t) < $7 AS ok),
                   kept AS (
                       INSERT INTO undelivered (queue, session_id, tenant, message, reason)
                       SELECT $1, $2, $3, $4, $5 FROM room WHERE ok
                       ON CONFLICT (queue, (message ->> 'message_id')) DO NOTHING RETURNING 1)
                   SELECT ok AS "ok!" FROM room"#,
                &r.queue,
                r.session,
                r.tenant.as_deref(),
                &r.message,
                &r.reason,
                if r.instance { MAX_PARKED_PER_TENANT } else { MAX_PARKED_PER_QUEUE },
                MAX_PARKED_PER_TENANT
            )
            .fetch_one(&mut *tx)
            .await?;
            if !room {
                over += 1;
            }
        }
        tx.commit().await?;
        Ok(over)
    }

    /// Claims up to `limit` due replies, each the oldest of its queue (a later one waits for
    /// it), for [`CLAIM`]; of a tenant, no more than `per_tenant` less what it has in flight
    /// (`busy`: tenants and their offers in flight). Replies of no tenant are not capped.
    pub async fn claim_parked(
        &self,
        limit: i64,
        per_tenant: i64,
        busy: &[(String, i64)],
    ) -> Result<Vec<Parked>, StoreError> {
        let (busy_tenants, busy_offers): (Vec<String>, Vec<i64>) = busy.iter().cloned().unzip();
        // Each tenant's heads in turn (every tenant's oldest, then every tenant's second, ...),
        // so one tenant's many refusing queues do not hold back another's replies. The limit
        // counts rows this process could lock: another's claims are skipped, not counted. The
        // queues are walked on their index, one step each (`aptix_parked_queues`), and only
        // each one's oldest reply is read: a queue's thousand waiting replies cost one.
        let rows = sqlx::query!(
            r#"UPDATE undelivered u SET next_try_at = now() + make_interval(secs => $2)
               WHERE u.id IN (
                   SELECT l.id FROM undelivered l
                   JOIN (SELECT d.id, d.tenant,
                                row_number() OVER (PARTITION BY d.tenant ORDER BY d.id) AS nth
                         FROM aptix_parked_queues() q (queue)
                         CROSS JOIN LATERAL (SELECT h.id, h.tenant, h.next_try_at
                                             FROM undelivered h WHERE h.queue = q.queue
                                             ORDER BY h.id LIMIT 1) d
                         WHERE d.next_try_at <= now()) heads
                     ON heads.id = l.id
                   LEFT JOIN unnest($3::text[], $4::int8[]) AS busy (tenant, offers)
                     ON busy.tenant = heads.tenant
                   WHERE l.next_try_at <= now()
                     AND (heads.tenant IS NULL
                          OR heads.nth + coalesce(busy.offers, 0) <= $5)
                   ORDER BY heads.nth, l.id LIMIT $1
                   FOR UPDATE OF l SKIP LOCKED)
               RETURNING u.id, u.queue, u.tenant, u.message, u.tries,
                         extract(epoch FROM now() - u.created_at)::float8 AS "age!""#,
            limit,
            CLAIM.as_secs_f64(),
            &busy_tenants,
            &busy_offers,
            per_tenant
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Parked {
                id: r.id,
                queue: r.queue,
                tenant: r.tenant,
                message: r.message,
                tries: r.tries,
                age: Duration::from_secs_f64(r.age.max(0.0)),
            })
            .collect())
    }

    /// A parked reply was delivered (or kept elsewhere): it is no longer waiting.
    pub async fn unpark(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query!("DELETE FROM undelivered WHERE id = $1", id).execute(&self.pool).await?;
        Ok(())
    }

    /// A parked reply was refused again: offered next after `after`.
    pub async fn park_again(&self, id: i64, after: Duration) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE undelivered SET tries = tries + 1,
                    next_try_at = now() + make_interval(secs => $2) WHERE id = $1",
            id,
            after.as_secs_f64()
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Replies parked for `session`, oldest first (the reply messages as stored).
    pub async fn parked_for_session(
        &self,
        session: Uuid,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(sqlx::query_scalar!(
            "SELECT message FROM undelivered WHERE session_id = $1 ORDER BY id",
            session
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The queues that have replies parked (at most `limit`).
    pub async fn parked_queues(&self, limit: i64) -> Result<Vec<String>, StoreError> {
        // Walked on the queue index, one step per queue, however many replies each holds.
        Ok(sqlx::query_scalar!(
            r#"SELECT q AS "queue!" FROM aptix_parked_queues() q LIMIT $1"#,
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Replies parked now, in all.
    pub async fn parked_len(&self) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM undelivered"#);
        Ok(n.fetch_one(&self.pool).await?)
    }
}

impl Store {
    /// The stage-message key the migrations created in this database (`pipeline_secret`).
    pub async fn message_key(&self) -> Result<String, StoreError> {
        Ok(sqlx::query_scalar!("SELECT value FROM pipeline_secret WHERE name = 'message_key'")
            .fetch_one(&self.pool)
            .await?)
    }
}
