//! Money budgets in PostgreSQL (docs/tenancy.md §7a). Before an LLM call the invoke stage
//! reserves the call's worst case against every budget that applies (its tenant's, its
//! ConversationContext's), holding each scope's row of `budget_locks`, so any number of workers
//! decide as one; the persist stage settles the reservation to the call's cost in the
//! transaction that writes its record. Spend is summed from the rows, an open one at its
//! reservation, so there is no counter to drift and a crashed worker never frees budget it may
//! have spent.

use sqlx::PgConnection;

use super::{Store, StoreError};
use crate::config::{Budget, Usd};
use crate::contracts::{TenantName, TurnKey};

/// The period a ceiling is per.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

impl Period {
    /// `day` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

/// A ceiling a call would pass: whose, per what, and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// `tenant <name>` or `ConversationContext <id>`.
    pub scope: String,
    /// The period of the ceiling.
    pub period: Period,
    /// The ceiling.
    pub budget: Usd,
    /// Spent and reserved in the period before this call.
    pub spent: Usd,
    /// Of `spent`, what other calls in flight have reserved and not yet settled.
    pub open: Usd,
}

impl Exhausted {
    /// Whether a call of `worst` would fit once the calls in flight settled at nothing more
    /// than they have spent: worth waiting for, rather than refusing.
    pub fn fits_once_settled(&self, worst: Usd) -> bool {
        let settled = self.spent.micros().saturating_sub(self.open.micros());
        settled.saturating_add(worst.micros()) <= self.budget.micros()
    }
}

/// One call's reservation: the budgets it counts against and its worst case.
#[derive(Debug, Clone)]
pub struct CallReservation<'a> {
    /// The turn and round trip.
    pub key: &'a TurnKey,
    /// The round trip (the record's step).
    pub step: i32,
    /// The tenant and its budget (none single-tenant).
    pub tenant: Option<(&'a TenantName, Budget)>,
    /// The ConversationContext and its budget.
    pub context: (&'a str, Budget),
    /// What the call can cost at most.
    pub worst: Usd,
}

/// Spend of a scope in the current UTC day and month, open reservations at their amount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// This UTC day.
    pub day: Usd,
    /// This UTC month.
    pub month: Usd,
    /// Of `day`, reserved by calls in flight (open reservations of the last 15 minutes).
    pub open_day: Usd,
    /// Of `month`, reserved by calls in flight.
    pub open_month: Usd,
}

/// Whose spend is summed: a tenant's or a ConversationContext's.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Tenant(&'a str),
    Context(&'a str),
}

/// The spend of the scope whose column is `$column`, this UTC day and month, in micro-dollars.
/// An open reservation counts as a call in flight for 15 minutes; an older one is a call whose
/// round trip was never recorded (its worker died and the turn went no further), which stays
/// spent at its worst case.
macro_rules! spent_query {
    ($column:literal, $value:expr) => {
        sqlx::query!(
            r#"SELECT COALESCE(sum(COALESCE(cost_micros, reserved_micros))
                          FILTER (WHERE at >= date_trunc('day', now(), 'UTC')), 0)::bigint AS "day!",
                      COALESCE(sum(COALESCE(cost_micros, reserved_micros)), 0)::bigint AS "month!",
                      COALESCE(sum(reserved_micros) FILTER (
                          WHERE cost_micros IS NULL AND at > now() - interval '15 minutes'
                            AND at >= date_trunc('day', now(), 'UTC')), 0)::bigint AS "open_day!",
                      COALESCE(sum(reserved_micros) FILTER (
                          WHERE cost_micros IS NULL AND at > now() - interval '15 minutes'), 0
                      )::bigint AS "open_month!"
               FROM spend WHERE "#
                + $column
                + " = $1 AND at >= date_trunc('month', now(), 'UTC')",
            $value
        )
    };
}

/// Spend of one scope this UTC day and month.
async fn spent(conn: &mut PgConnection, scope: Scope<'_>) -> Result<Spent, StoreError> {
    let r = match scope {
        Scope::Tenant(t) => {
            let r = spent_query!("tenant", t).fetch_one(&mut *conn).await?;
            [r.day, r.month, r.open_day, r.open_month]
        }
        Scope::Context(c) => {
            let r = spent_query!("context", c).fetch_one(&mut *conn).await?;
            [r.day, r.month, r.open_day, r.open_month]
        }
    };
    let usd = |m: i64| Usd::from_micros(u64::try_from(m).unwrap_or(0));
    Ok(Spent { day: usd(r[0]), month: usd(r[1]), open_day: usd(r[2]), open_month: usd(r[3]) })
}

/// Holds `scope`'s lock row for the rest of the transaction (created on first use; the upsert
/// locks it in one statement).
async fn lock(conn: &mut PgConnection, scope: &str) -> Result<(), StoreError> {
    sqlx::query!(
        "INSERT INTO budget_locks (scope) VALUES ($1)
         ON CONFLICT (scope) DO UPDATE SET scope = EXCLUDED.scope",
        scope
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The first ceiling of `budget` that `spent + worst` would pass.
fn over(scope: String, budget: Budget, spent: Spent, worst: Usd) -> Option<Exhausted> {
    [
        (Period::Day, budget.per_day, spent.day, spent.open_day),
        (Period::Month, budget.per_month, spent.month, spent.open_month),
    ]
    .into_iter()
    .find(|(_, ceiling, spent, _)| {
        !ceiling.is_zero() && spent.micros().saturating_add(worst.micros()) > ceiling.micros()
    })
    .map(|(period, budget, spent, open)| Exhausted {
        scope: scope.clone(),
        period,
        budget,
        spent,
        open,
    })
}

impl Store {
    /// Reserves a call's worst case against its budgets, or says which ceiling it would pass
    /// (nothing is reserved then). An earlier attempt of the same round trip still open (its
    /// worker died in the call, or the call failed in a way the provider may have billed) is
    /// settled at its reservation first: each attempt that may have been billed counts whole.
    /// The reservation's id, for [`Store::settle_unbilled`].
    pub async fn reserve_call(
        &self,
        r: &CallReservation<'_>,
    ) -> Result<Result<i64, Exhausted>, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Always tenant before context: two workers never wait on each other's second lock.
        let tenant = r.tenant.filter(|(_, b)| b.is_set());
        let (context, context_budget) = r.context;
        if let Some((name, _)) = tenant {
            lock(&mut tx, &format!("tenant:{name}")).await?;
        }
        if context_budget.is_set() {
            lock(&mut tx, &format!("context:{context}")).await?;
        }
        let key = (r.key.session_id.as_uuid(), r.key.turn_id.as_str(), r.step);
        settle(&mut tx, key, Settle::AtReservation).await?;
        let mut over_one = None;
        if let Some((name, budget)) = tenant {
            let spent = spent(&mut tx, Scope::Tenant(name.as_str())).await?;
            over_one = over(format!("tenant {name}"), budget, spent, r.worst);
        }
        if over_one.is_none() && context_budget.is_set() {
            let spent = spent(&mut tx, Scope::Context(context)).await?;
            over_one =
                over(format!("ConversationContext {context}"), context_budget, spent, r.worst);
        }
        if let Some(e) = over_one {
            tx.commit().await?;
            return Ok(Err(e));
        }
        let id = sqlx::query_scalar!(
            "INSERT INTO spend (tenant, context, session_id, turn_id, step, reserved_micros)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            r.tenant.map(|(t, _)| t.as_str()),
            context,
            key.0,
            key.1,
            key.2,
            r.worst.micros_i64()
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(id))
    }

    /// The tokens the provider's stored response `response_id` of this session holds (its input
    /// and output), which a call continuing it is billed as input again; 0 when unknown.
    pub async fn chain_tokens(
        &self,
        session: &crate::contracts::SessionId,
        response_id: &str,
    ) -> Result<u64, StoreError> {
        let tokens = sqlx::query_scalar!(
            "SELECT (usage->>'InputTokens')::bigint + (usage->>'OutputTokens')::bigint
             FROM response_records WHERE session_id = $1 AND provider_response_id = $2
             ORDER BY created_at DESC LIMIT 1",
            session.as_uuid(),
            response_id
        )
        .fetch_optional(&self.pool)
        .await?
        .flatten();
        Ok(tokens.map_or(0, |t| u64::try_from(t).unwrap_or(0)))
    }

    /// Spend per tenant and UTC day over the last `days` days (settled, and reserved where
    /// not yet settled), in micro-dollars, oldest first; only `tenant`'s when given.
    pub async fn daily_spend(
        &self,
        tenant: Option<&str>,
        days: i32,
    ) -> Result<Vec<(String, chrono::NaiveDate, i64)>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT tenant AS "tenant!", (at AT TIME ZONE 'UTC')::date AS "day!",
                      sum(COALESCE(cost_micros, reserved_micros))::bigint AS "micros!"
               FROM spend
               WHERE tenant IS NOT NULL AND ($1::text IS NULL OR tenant = $1)
                 AND at >= date_trunc('day', now(), 'UTC') - make_interval(days => $2 - 1)
               GROUP BY 1, 2 ORDER BY 2, 1"#,
            tenant,
            days
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.tenant, r.day, r.micros)).collect())
    }

    /// A tenant's spend this UTC day and month (for admission, `aptix status` and gauges).
    pub async fn tenant_spend(&self, tenant: &TenantName) -> Result<Spent, StoreError> {
        let mut conn = self.pool.acquire().await?;
        spent(&mut conn, Scope::Tenant(tenant.as_str())).await
    }

    /// A ConversationContext's spend this UTC day and month.
    pub async fn context_spend(&self, context: &str) -> Result<Spent, StoreError> {
        let mut conn = self.pool.acquire().await?;
        spent(&mut conn, Scope::Context(context)).await
    }
}

/// Whether the tenant's spend has reached a ceiling of `budget` (admission: a turn is refused or
/// held; the tenant's lock is held by the caller).
pub(super) async fn tenant_over(
    conn: &mut PgConnection,
    tenant: &TenantName,
    budget: Budget,
) -> Result<Option<Exhausted>, StoreError> {
    if !budget.is_set() {
        return Ok(None);
    }
    let spent = spent(conn, Scope::Tenant(tenant.as_str())).await?;
    // Nothing more may start once a ceiling is reached (a call of any cost would pass it).
    Ok(over(format!("tenant {tenant}"), budget, spent, Usd::from_micros(1)))
}

/// How a round trip's reservation settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// To the call's cost (an answer's usage, priced; zero for a call the provider refused).
    Cost(Usd),
    /// To the reservation itself: a call aborted before it reported usage cost an unknown
    /// amount up to its worst case.
    AtReservation,
}

impl Store {
    /// Settles reservation `id` at nothing, if still open: its call was refused by the provider
    /// without being billed (a lost chain, called again rebuilt under a reservation of its
    /// own). Only that reservation: another attempt's, open beside it, may have been billed.
    pub async fn settle_unbilled(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE spend SET cost_micros = 0, settled_at = clock_timestamp()
             WHERE id = $1 AND cost_micros IS NULL",
            id
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// Settles the round trip's open reservation, if any (in the transaction that writes its
/// record, so exactly once; a redelivered persist finds it settled).
pub(super) async fn settle(
    conn: &mut PgConnection,
    key: (uuid::Uuid, &str, i32),
    how: Settle,
) -> Result<(), StoreError> {
    let cost = match how {
        Settle::Cost(c) => Some(c.micros_i64()),
        Settle::AtReservation => None,
    };
    sqlx::query!(
        "UPDATE spend SET cost_micros = COALESCE($4, reserved_micros), settled_at = clock_timestamp()
         WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND cost_micros IS NULL",
        key.0,
        key.1,
        key.2,
        cost
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}
