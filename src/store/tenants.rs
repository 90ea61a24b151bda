//! A tenant's limits, decided in PostgreSQL so that every worker decides as one: each decision
//! holds the tenant's row of `tenant_locks`, then counts what the limits count (turns open,
//! turns and sessions of the last minute, tokens of the last minute) from the rows themselves,
//! so there is no counter to drift after a crash. Turns held over a limit (`over_limit =
//! "queue"`) are their session's head in state `queued`; [`start_held`] starts them, oldest
//! first, when the tenant is under its limits again.

use sqlx::PgConnection;

use super::outbox::{self, OutboxRow, PendingOutbox};
use super::turn_row::{query_turns, TurnRow};
use super::{Store, StoreError};
use crate::config::{OverLimit, TenantLimits};
use crate::contracts::TenantName;
use crate::lifecycle::{transition, Event, Phase};
use crate::messages::Outgoing;

/// A tenant and its limits, for a decision.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The tenant.
    pub tenant: TenantName,
    /// Its limits.
    pub limits: TenantLimits,
}

/// The limit a turn or a session was over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `turns_in_flight`.
    TurnsInFlight(u32),
    /// `turns_per_minute`.
    TurnsPerMinute(u32),
    /// `sessions_per_minute`.
    SessionsPerMinute(u32),
    /// `tokens_per_minute`.
    TokensPerMinute(u64),
    /// `usd_per_day` or `usd_per_month`: the ceiling of the period, reached.
    Budget(super::Period, crate::config::Usd),
}

impl Gate {
    /// Whether any of its limits is set: a tenant without one has its turns admitted and ended
    /// in one round trip each, and no tokens kept for it (only a limit reads them).
    pub fn is_limited(&self) -> bool {
        !self.limits.unlimited()
    }

    fn queues(&self) -> bool {
        self.limits.over_limit == OverLimit::Queue
    }
}

/// Takes the tenant's lock for the rest of the transaction.
pub(super) async fn lock(conn: &mut PgConnection, tenant: &TenantName) -> Result<(), StoreError> {
    let tenant = tenant.as_str();
    let lock =
        || sqlx::query!("SELECT 1 AS one FROM tenant_locks WHERE tenant = $1 FOR UPDATE", tenant);
    if lock().fetch_optional(&mut *conn).await?.is_none() {
        sqlx::query!(
            "INSERT INTO tenant_locks (tenant) VALUES ($1) ON CONFLICT DO NOTHING",
            tenant
        )
        .execute(&mut *conn)
        .await?;
        lock().fetch_one(&mut *conn).await?;
    }
    Ok(())
}

/// Whether the session this transaction created may stay (the lock is held).
pub(super) async fn session_allowed(
    conn: &mut PgConnection,
    gate: &Gate,
) -> Result<Result<(), Limit>, StoreError> {
    let max = gate.limits.sessions_per_minute;
    if max == 0 {
        return Ok(Ok(()));
    }
    // The count includes the session this transaction just created.
    let n = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM sessions
           WHERE tenant = $1 AND created_at > clock_timestamp() - interval '60 seconds'"#,
        gate.tenant.as_str()
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(if n <= i64::from(max) { Ok(()) } else { Err(Limit::SessionsPerMinute(max)) })
}

/// What a tenant's limits leave room for now.
pub(super) struct Room {
    /// Turns that may start.
    turns: i64,
    /// Tokens of the minute left (`i64::MAX` without `tokens_per_minute`).
    tokens_left: i64,
    /// What a turn in flight reserves at least (0 without `tokens_per_minute`).
    reserve: i64,
}

/// How many more turns may start now (refuse mode: be admitted), up to `want` (the lock is
/// held); the first limit in the way when none may. `estimate`: the tokens the turn asking
/// will at least use, from its request (0 when unknown).
pub(super) async fn room(
    conn: &mut PgConnection,
    gate: &Gate,
    want: i64,
    estimate: i64,
) -> Result<Result<Room, Limit>, StoreError> {
    let (l, tenant) = (&gate.limits, &gate.tenant);
    if let Some(e) = super::budget::tenant_over(conn, tenant, l.budget()).await? {
        return Ok(Err(Limit::Budget(e.period, e.budget)));
    }
    let mut room = Room { turns: want, tokens_left: i64::MAX, reserve: 0 };
    if l.turns_in_flight > 0 {
        let left = i64::from(l.turns_in_flight) - open_turns(conn, gate).await?;
        if left <= 0 {
            return Ok(Err(Limit::TurnsInFlight(l.turns_in_flight)));
        }
        room.turns = room.turns.min(left);
    }
    if l.turns_per_minute > 0 {
        let left = i64::from(l.turns_per_minute) - recent_turns(conn, gate).await?;
        if left <= 0 {
            return Ok(Err(Limit::TurnsPerMinute(l.turns_per_minute)));
        }
        room.turns = room.turns.min(left);
    }
    if l.tokens_per_minute > 0 {
        let limit = i64::try_from(l.tokens_per_minute).unwrap_or(i64::MAX);
        let budget = token_budget(conn, gate).await?;
        let left = limit.saturating_sub(budget.used).saturating_sub(budget.reserved);
        if left <= 0 {
            return Ok(Err(Limit::TokensPerMinute(l.tokens_per_minute)));
        }
        // Each turn started now reserves its share of what is left.
        let reserve = budget.reserve.max(estimate);
        room.turns = room.turns.min((left + reserve - 1) / reserve);
        (room.tokens_left, room.reserve) = (left, budget.reserve);
    }
    Ok(Ok(room))
}

/// Counts the tenant's turns that match `$condition`, a literal, so that the planner sees it
/// (and the partial index `turns_tenant_open` serves the state lists).
macro_rules! count_turns {
    ($conn:expr, $tenant:expr, $condition:literal) => {
        sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!" FROM turns WHERE tenant = $1 AND "# + $condition,
            $tenant
        )
        .fetch_one(&mut *$conn)
        .await?
    };
}

/// The tenant's turns open. Refused turns count from their admission (a turn queued behind its
/// session will start whatever happens); held ones from their start.
async fn open_turns(conn: &mut PgConnection, gate: &Gate) -> Result<i64, StoreError> {
    let tenant = gate.tenant.as_str();
    Ok(if gate.queues() {
        count_turns!(
            conn,
            tenant,
            "state IN ('running', 'awaiting_tool_results', 'awaiting_approval')"
        )
    } else {
        count_turns!(
            conn,
            tenant,
            "state IN ('queued', 'running', 'awaiting_tool_results', 'awaiting_approval')"
        )
    })
}

/// The tenant's turns of the last minute: held ones by their start, refused ones by their
/// admission (as [`open_turns`]).
async fn recent_turns(conn: &mut PgConnection, gate: &Gate) -> Result<i64, StoreError> {
    let tenant = gate.tenant.as_str();
    Ok(if gate.queues() {
        count_turns!(conn, tenant, "started_at > clock_timestamp() - interval '60 seconds'")
    } else {
        count_turns!(conn, tenant, "created_at > clock_timestamp() - interval '60 seconds'")
    })
}

/// Least a turn in flight reserves of `tokens_per_minute` until its round trip is charged.
pub const MIN_TOKEN_RESERVE: i64 = 1_000;

/// A tenant's tokens of the last minute: charged, and reserved by its turns in flight.
struct TokenBudget {
    /// Charged by round trips recorded in the last 60 s.
    used: i64,
    /// What a turn in flight reserves at least: the most of [`MIN_TOKEN_RESERVE`] and the
    /// tenant's largest round trip of the last two minutes.
    reserve: i64,
    /// What its turns admitted and not yet waiting for tool results (their calls are to come or
    /// running, uncharged) reserve: each the most of `reserve` and its own request's estimate
    /// (`turns.token_estimate`, migration 0033).
    reserved: i64,
}

/// Reads the tenant's token budget (the lock is held). Reserving closes the gap between a
/// turn's admission and the charge of its round trip: without it, every turn admitted while
/// the first ones run sees the minute's budget untouched (docs/tenancy.md §7).
async fn token_budget(conn: &mut PgConnection, gate: &Gate) -> Result<TokenBudget, StoreError> {
    // Turns whose calls are to come or running: held ones only once started.
    let r = sqlx::query!(
        r#"WITH spent AS (
               SELECT COALESCE(sum(tokens) FILTER (
                          WHERE at > clock_timestamp() - interval '60 seconds'), 0)::bigint AS used,
                      greatest($2::bigint, COALESCE(max(tokens) FILTER (
                          WHERE at > clock_timestamp() - interval '120 seconds'), 0))::bigint
                          AS reserve
               FROM tenant_tokens WHERE tenant = $1)
           SELECT used AS "used!", reserve AS "reserve!",
                  (SELECT COALESCE(sum(greatest(spent.reserve, COALESCE(t.token_estimate, 0))), 0)
                   FROM turns t WHERE t.tenant = $1
                       AND (t.state = 'running' OR (t.state = 'queued' AND NOT $3)))::bigint
                      AS "reserved!"
           FROM spent"#,
        gate.tenant.as_str(),
        MIN_TOKEN_RESERVE,
        gate.queues()
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(TokenBudget { used: r.used, reserve: r.reserve, reserved: r.reserved })
}

/// What an image of a request counts for in an estimate, tokens (a high-detail image is billed
/// about this much, whatever its base64's length).
const IMAGE_TOKENS: i64 = 1_000;

/// The tokens a turn will at least use, from its request: its JSON's length over 4 (the usual
/// characters per token), its images [`IMAGE_TOKENS`] each instead of their base64, before
/// anything is retrieved or answered. Migration 0033's trigger counts the same for each turn.
pub(super) fn request_estimate(gate: &Gate, request: &serde_json::Value) -> i64 {
    if gate.limits.tokens_per_minute == 0 {
        return 0;
    }
    let size = |v: &serde_json::Value| serde_json::to_vec(v).map_or(0, |b| b.len());
    let images = request.get("ClipboardImages").filter(|i| i.is_array());
    let text = size(request).saturating_sub(images.map_or(0, size));
    let count = images.and_then(serde_json::Value::as_array).map_or(0, Vec::len);
    let per_text = i64::try_from(text / 4).unwrap_or(i64::MAX);
    per_text.saturating_add(IMAGE_TOKENS.saturating_mul(i64::try_from(count).unwrap_or(0)))
}

/// Held turns started at most at once: the statement returns each with its request (up to
/// `limits.max_request_bytes`) and makes its start message, and the periodic pass (`held`,
/// twice a second) and every turn's end start more.
const HELD_BATCH: i64 = 64;

/// Starts the tenant's held turns, oldest first, while its limits allow (the lock is held).
/// Returns the started turns.
pub(super) async fn start_held(
    conn: &mut PgConnection,
    gate: &Gate,
) -> Result<Vec<TurnRow>, StoreError> {
    let Ok(room) = room(conn, gate, HELD_BATCH, 0).await? else { return Ok(Vec::new()) };
    // With a token limit, each turn reserves the most of the tenant's reservation and its own
    // estimate, and starts while what is left, less what the turns before it reserve, is
    // positive: a batch of large requests starts one by one as the minute allows.
    // The turns it picks are held: queued, and their session's active turn.
    let to = transition(Some(Phase::Held), Event::RoomFreed)?;
    let mut rows = query_turns!(
        "UPDATE turns SET state = $3, started_at = clock_timestamp(), updated_at = now()
         WHERE (session_id, turn_id) IN (
             SELECT session_id, turn_id FROM (
                 SELECT session_id, turn_id,
                        sum(need) OVER (ORDER BY created_at, session_id
                                        ROWS UNBOUNDED PRECEDING) - need AS before
                 FROM (SELECT t.session_id, t.turn_id, t.created_at,
                              greatest($5::bigint, COALESCE(t.token_estimate, 0)) AS need
                       FROM turns t
                       JOIN sessions s ON s.id = t.session_id AND s.active_turn_id = t.turn_id
                       WHERE t.tenant = $1 AND t.state = 'queued'
                       ORDER BY t.created_at LIMIT $2) held) ahead
             WHERE before < $4::bigint)
         RETURNING ",
        "",
        gate.tenant.as_str(),
        room.turns,
        to.column().as_str(),
        room.tokens_left,
        room.reserve
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.sort_by_key(|r| r.seq);
    Ok(rows)
}

/// Outbox rows that start `rows`, each under its own turn.
pub(super) async fn start_messages(
    conn: &mut PgConnection,
    rows: &[TurnRow],
) -> Result<PendingOutbox, StoreError> {
    let mut out = PendingOutbox::default();
    for row in rows {
        let start = vec![Outgoing::Start(row.start_job()?)];
        let one = outbox::insert(conn, row.session_id, &row.turn_id, start).await?;
        out.append(one);
    }
    Ok(out)
}

/// Counts the LLM tokens of a round trip's record (`usage.TotalTokens`) against its tenant's
/// per-minute budget, in the transaction that writes the record (so exactly once), and forgets
/// those outside the window.
pub(super) async fn charge_tokens(
    conn: &mut PgConnection,
    tenant: &str,
    usage: Option<&serde_json::Value>,
) -> Result<(), StoreError> {
    let tokens = usage.and_then(|u| u.get("TotalTokens")).and_then(serde_json::Value::as_i64);
    let Some(tokens) = tokens.filter(|t| *t > 0) else { return Ok(()) };
    sqlx::query!("INSERT INTO tenant_tokens (tenant, tokens) VALUES ($1, $2)", tenant, tokens)
        .execute(&mut *conn)
        .await?;
    sqlx::query!(
        "DELETE FROM tenant_tokens WHERE tenant = $1 AND at < clock_timestamp() - interval '120 seconds'",
        tenant
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

impl Store {
    /// Starts the held turns of every tenant in `gates` that its limits now allow (called
    /// periodically: a per-minute window frees room without any turn ending). Their start
    /// messages are in the returned outbox. A tenant whose turns cannot be started now (a
    /// database error, a stored request no longer readable) is logged and passed over: it
    /// holds back neither the others nor the starts already committed.
    pub async fn start_held_turns(&self, gates: &[Gate]) -> Result<PendingOutbox, StoreError> {
        let mut out = PendingOutbox::default();
        for gate in gates.iter().filter(|g| g.queues()) {
            match self.start_held_of(gate).await {
                Ok(one) => out.append(one),
                Err(error) => {
                    tracing::warn!(tenant = %gate.tenant, %error, "held turns of a tenant not started this pass");
                }
            }
        }
        Ok(out)
    }

    async fn start_held_of(&self, gate: &Gate) -> Result<PendingOutbox, StoreError> {
        let mut tx = self.pool.begin().await?;
        let held = sqlx::query!(
            "SELECT 1 AS one FROM turns t JOIN sessions s
                 ON s.id = t.session_id AND s.active_turn_id = t.turn_id
             WHERE t.tenant = $1 AND t.state = 'queued' LIMIT 1",
            gate.tenant.as_str()
        )
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            return Ok(PendingOutbox::default());
        }
        lock(&mut tx, &gate.tenant).await?;
        let rows = start_held(&mut tx, gate).await?;
        let one = start_messages(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok(one)
    }

    /// Start messages of tenants' turns left unpublished for `age` (their publisher stopped
    /// between commit and publish), to publish again. Those of turns started by a stage's own
    /// transaction are found by its redelivered message long before.
    pub async fn orphaned_starts(
        &self,
        age: std::time::Duration,
    ) -> Result<PendingOutbox, StoreError> {
        let rows = sqlx::query_as!(
            OutboxRow,
            r#"SELECT o.id, o.payload, o.exchange, o.routing_key, o.message_id, o.kind,
                      o.declare_session, o.headers, o.body, false AS "fresh!"
               FROM outbox o JOIN turns t ON t.session_id = o.session_id AND t.turn_id = o.turn_id
               WHERE t.tenant IS NOT NULL AND o.payload->>'Kind' = 'outgoing.start/v1'
                 AND o.created_at < now() - make_interval(secs => $1)
               ORDER BY o.id LIMIT 100"#,
            age.as_secs_f64()
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(outbox::decode_each(&rows))
    }
}
