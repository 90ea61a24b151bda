//! PostgreSQL: sessions, the turn state machine, immutable response records, provider results
//! and the transactional outbox. One small client, created with its timeouts, used by stages.

mod actions;
mod admission;
mod admit;
mod admit_ways;
mod approvals;
mod browse;
mod budget;
mod cancel;
mod claims;
mod effects;
mod eval;
mod fail;
mod files;
mod finish_at_once;
mod json_text;
mod liveness;
mod members;
mod new_record;
mod new_turn;
mod outbox;
mod records;
mod refusals;
mod reprocess;
mod resume;
mod run_hold;
mod session_lock;
mod sessions;
mod steer;
mod step_end;
mod stream_events;
mod sweep;
mod tenants;
mod texts;
mod tool_refs;
mod turn_row;
mod turns;
mod undelivered;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions as _, PgPool};

pub use actions::OperatorAction;
pub use admission::Admission;
pub use admit::SessionMeta;
pub use admit_ways::MAX_QUEUED_PER_SESSION;
pub use approvals::EXPIRY_MESSAGE;
pub use browse::{SessionSearch, SessionSummary, CONSOLE_ROWS};
pub use budget::{CallReservation, Exhausted, Period, Settle, Spent};
pub use cancel::{cancelled, CancelAdmission};
pub use claims::{CallState, CLAIM_LEASE};
pub use effects::{EffectKey, EffectStart};
pub use eval::EvalRow;
pub use files::KeptFile;
pub use new_record::NewRecord;
pub use outbox::PendingOutbox;
pub use records::Finished;
pub use refusals::{StoredBody, StoredReply, MAX_STORED_REFUSALS_PER_TENANT};
pub use reprocess::{LinkedRecord, OriginalStep, SelectedTurn, TurnSelector};
pub use resume::ContinuationAdmission;
pub use run_hold::RunHold;
pub use sessions::{SessionOwner, SessionView, StateRead, StateToUpdate};
pub use step_end::{FinishStep, StepOutcome};
pub use stream_events::{Replayed, Resumable, ResumeFound, KEPT_STEPS};
pub use tenants::{Gate, Limit, MIN_TOKEN_RESERVE};
pub use turns::{TurnRow, TurnState};
pub use undelivered::{ParkReply, Parked, MAX_PARKED_PER_QUEUE, MAX_PARKED_PER_TENANT};

/// Embedded migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The same migrations as a worker applies them when it starts (`migrate_on_start`): a database
/// a newer build already migrated is not refused. Every migration is additive while two builds
/// run side by side (docs/reliability.md, "Upgrades"), so a worker of the previous build that
/// starts during a rollout or a rollback (a scale-up, a crash restart) runs; `aptix migrate`
/// still refuses a database it does not know.
static WORKER_MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| {
        let mut migrator = sqlx::migrate!("./migrations");
        migrator.set_ignore_missing(true);
        migrator
    });

/// Why a database operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connection or query failure; usually transient (restart, network).
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// Migrations could not be applied.
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Stored JSON did not match the expected shape.
    #[error("stored data is malformed: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// A step was offered for a turn that is not running at that step (a duplicate of a step
    /// already ended differently, or a forged message).
    #[error("turn `{turn}` is not running step {step} (it is {state})")]
    NotRunning {
        /// The turn.
        turn: String,
        /// The step offered.
        step: i32,
        /// The turn's state (and step, when running another).
        state: String,
    },
    /// A step's write found its turn no longer running that step, yet a read right after found
    /// it running it: the turn changed between the two, which the session's lock forbids.
    /// Retrying reads it afresh.
    #[error("turn `{turn}` changed while step {step} was written")]
    Changed {
        /// The turn.
        turn: String,
        /// The step offered.
        step: i32,
    },
    /// A copy of this user turn was admitted while this admission waited for its session's
    /// lock; admitting again finds the copy.
    #[error("a copy of turn `{turn}` was admitted meanwhile")]
    AdmittedMeanwhile {
        /// The turn.
        turn: String,
    },
    /// A session created (or found) a moment ago was gone when locked: the expiry sweep took it
    /// in between. Retrying creates it afresh.
    #[error("session `{0}` vanished while it was opened")]
    Vanished(uuid::Uuid),
    /// The session's previous turn ended moments ago and its reply is still being published: a
    /// new turn waits, so it cannot overtake that reply.
    #[error("the session's previous reply is still being published")]
    ReplyInFlight,
    /// A statement run for several callers at once failed (see `sweep`).
    #[error(transparent)]
    Shared(std::sync::Arc<StoreError>),
    /// A write the turn's life does not allow (`lifecycle::transition` refused it).
    #[error("turn transition refused: {0}")]
    Transition(#[from] crate::lifecycle::Refused),
}

impl StoreError {
    /// Whether retrying later can succeed (everything but corrupt data and constraint bugs).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Db(e) | StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => {
                sqlx_transient(e)
            }
            StoreError::Migrate(_)
            | StoreError::Corrupt(_)
            | StoreError::NotRunning { .. }
            | StoreError::Transition(_) => false,
            StoreError::ReplyInFlight
            | StoreError::Vanished(_)
            | StoreError::AdmittedMeanwhile { .. }
            | StoreError::Changed { .. } => true,
            StoreError::Shared(e) => e.is_transient(),
        }
    }
}

fn sqlx_transient(e: &sqlx::Error) -> bool {
    match e {
        // Serialization failures, deadlocks, statement and lock timeouts, too many connections,
        // shutdowns, lost connections, a full disk or memory, and a node that answers read-only
        // (25006: a demoted primary, or a standby behind an address a failover has not moved
        // yet) pass, and so does 08P01, which PgBouncer answers while its server is away
        // (`query_wait_timeout`, a failover); constraint and data errors are bugs that a retry
        // only repeats.
        sqlx::Error::Database(e) => matches!(
            e.code().as_deref(),
            Some(
                "40001"
                    | "40P01"
                    | "57014"
                    | "55P03"
                    | "53100"
                    | "53200"
                    | "53300"
                    | "57P01"
                    | "57P02"
                    | "57P03"
                    | "25006"
                    | "08000"
                    | "08001"
                    | "08003"
                    | "08006"
                    | "08P01"
            )
        ),
        // The connection, its pool or its TLS failed: another connection, or the same one a
        // moment later, can succeed. A protocol error is a stream cut mid-message.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // A column that does not decode (a turn state no version wrote), a row that is not
        // there, a value that does not encode and a schema or setting that does not match are
        // the same on every try: retrying them only holds the message (and its session) longer.
        _ => false,
    }
}

impl crate::metrics::Ready for Store {
    fn ready(&self) -> futures_util::future::BoxFuture<'_, bool> {
        Box::pin(self.ping())
    }
}

/// How long a pooled connection may sit idle before it is tested on acquire.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A pool of at most `max` connections, with bounded acquire time.
fn pool_options(max: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        // A connection idle across a database restart is dead: test it before use, but only
        // after a second idle. Testing every acquire cost a round trip per statement or
        // transaction; a connection used a moment ago that died meanwhile fails its statement,
        // which is retried as any transient error is.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .idle_timeout(Duration::from_secs(60))
}

/// The database client.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// Each configured tenant's limits, by name (empty: single-tenant).
    tenants: std::sync::Arc<std::collections::HashMap<String, Gate>>,
    /// Published outbox rows waiting to be deleted, and the connection that deletes them.
    sweep: sweep::Sweeper,
    /// Session texts known to be stored.
    texts: texts::TextCache,
    /// The configured contexts' versions, for the records the store writes itself (failures).
    versions: std::sync::Arc<crate::config::ContextVersions>,
    /// This process's liveness lock, which invoke's claims name.
    liveness: liveness::Liveness,
}

impl Store {
    /// Connects lazily with bounded acquire and statement times, so a stopped database makes
    /// calls fail fast (and retry) rather than hang.
    pub fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let options: PgConnectOptions = url
            .parse::<PgConnectOptions>()?
            .application_name("aptix")
            .options([("statement_timeout", "15s")])
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        let pool = pool_options(max_connections).connect_lazy_with(options.clone());
        // Deleting published outbox rows has a connection of its own: behind the stages' own
        // statements in the pool's queue, a delete waited 0.3-0.6 s at the ceiling, and every
        // turn a client sent meanwhile found its session's last reply row and waited too. Its one
        // statement is planned for each batch: the generic plan PostgreSQL settled on while the
        // table was nearly empty seq-scanned it for good as dead rows piled up (278 pages a
        // delete a minute into a fresh database; docs/benchmarks.md, "Ninth pass").
        let sweep_options = options.options([("plan_cache_mode", "force_custom_plan")]);
        let sweep = sweep::Sweeper::new(pool_options(1).connect_lazy_with(sweep_options));
        let (tenants, texts, versions) = Default::default();
        let liveness = liveness::Liveness::new();
        Ok(Store { pool, tenants, sweep, texts, versions, liveness })
    }

    /// The same store, deciding limits for these tenants.
    pub fn with_tenants(mut self, gates: Vec<Gate>) -> Store {
        let map = gates.into_iter().map(|g| (g.tenant.as_str().to_owned(), g)).collect();
        self.tenants = std::sync::Arc::new(map);
        self
    }

    /// The same store, naming these context versions in the records it writes itself.
    pub fn with_versions(mut self, versions: crate::config::ContextVersions) -> Store {
        self.versions = std::sync::Arc::new(versions);
        self
    }

    /// The gate of a stored tenant name; `None` for no tenant or one no longer configured
    /// (its turns then run unlimited rather than never).
    pub(crate) fn gate(&self, tenant: Option<&str>) -> Option<Gate> {
        tenant.and_then(|t| self.tenants.get(t)).cloned()
    }

    /// Every tenant's gate.
    pub fn gates(&self) -> Vec<Gate> {
        self.tenants.values().cloned().collect()
    }

    /// Creates the database named in `url` if it does not exist (needs rights on `postgres`).
    pub async fn create_database(url: &str) -> Result<(), StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let name = options.get_database().unwrap_or("aptix").to_owned();
        let admin = options.database("postgres");
        let mut conn = admin.connect().await?;
        let exists = sqlx::query!("SELECT 1 AS one FROM pg_database WHERE datname = $1", &name)
            .fetch_optional(&mut conn)
            .await?;
        if exists.is_none() {
            let quoted = name.replace('"', "\"\"");
            let sql = format!("CREATE DATABASE \"{quoted}\"");
            sqlx::Executor::execute(&mut conn, sql.as_str()).await?;
        }
        Ok(())
    }

    /// Applies pending migrations (safe to run from many processes: sqlx takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.run_migrations(&MIGRATOR).await.map(drop)
    }

    /// Applies pending migrations as a starting worker does: a database that holds migrations
    /// this build does not know (a newer build's) is used as it is, with a warning.
    pub async fn migrate_as_worker(&self) -> Result<(), StoreError> {
        let newest = self.run_migrations(&WORKER_MIGRATOR).await?;
        let known = MIGRATOR.iter().map(|m| m.version).max();
        if let (Some(newest), Some(known)) = (newest, known) {
            if newest > known {
                tracing::warn!(
                    database = newest,
                    build = known,
                    "database migrated by a newer build; running on it"
                );
            }
        }
        Ok(())
    }

    /// The migrations this build knows that the database does not hold: a worker that does not
    /// migrate itself (`pipeline.migrate_on_start` off) refuses to start on such a database,
    /// whose missing tables and functions would fail every turn that reaches them.
    pub async fn missing_migrations(&self) -> Result<Vec<i64>, StoreError> {
        use sqlx::migrate::Migrate as _;
        let mut conn = self.pool.acquire().await?;
        let applied = match conn.list_applied_migrations().await {
            Ok(applied) => applied,
            // No migrations table: nothing applied yet.
            Err(sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some("42P01") =>
            {
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        };
        let held: std::collections::HashSet<i64> = applied.iter().map(|m| m.version).collect();
        let known = MIGRATOR.iter().filter(|m| m.migration_type.is_up_migration());
        Ok(known.map(|m| m.version).filter(|v| !held.contains(v)).collect())
    }

    /// Runs `migrator`; the newest migration the database then holds.
    async fn run_migrations(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<Option<i64>, StoreError> {
        // A migration that reads a large table (an index build, a backfill) takes longer than
        // 15 s, and cut short it would stop every worker's start.
        use sqlx::migrate::Migrate as _;
        use sqlx::Connection as _;
        let mut conn = self.long_connection().await?;
        let applied = match migrator.run(&mut conn).await {
            Ok(()) => conn.list_applied_migrations().await,
            Err(e) => Err(e),
        };
        let _ = conn.close().await;
        Ok(applied?.iter().map(|m| m.version).max())
    }

    /// A connection of its own, out of the pool, without the pool's statement timeout, for
    /// statements that read a whole table or run (migrations, a reprocess run's selection and
    /// comparison). Dropped, it is closed (and what it held let go).
    pub(crate) async fn long_connection(&self) -> Result<sqlx::PgConnection, StoreError> {
        let mut conn = self.pool.acquire().await?.detach();
        sqlx::query!("SELECT set_config('statement_timeout', '0', false) AS unset")
            .fetch_one(&mut conn)
            .await?;
        Ok(conn)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query!("SELECT 1 AS one").fetch_one(&self.pool).await.is_ok()
    }

    /// Counts one more redelivery of the ingress message `key` and returns the total. Rows a
    /// day old are dropped on the way: by then the message was settled long ago.
    pub async fn count_redelivery(&self, key: &str) -> Result<u32, StoreError> {
        let count = sqlx::query_scalar!(
            "WITH gc AS (DELETE FROM redeliveries WHERE last_seen < now() - interval '1 day')
             INSERT INTO redeliveries (message_key, deliveries) VALUES ($1, 1)
             ON CONFLICT (message_key) DO UPDATE
             SET deliveries = redeliveries.deliveries + 1, last_seen = now()
             RETURNING deliveries",
            key
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// The pool, for modules that run their own queries (reprocessing, reports).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every connection (the pool's and the outbox sweep's).
    pub async fn close(&self) {
        self.pool.close().await;
        self.sweep.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_retried_and_a_missing_row_or_bad_value_is_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        for e in [io, sqlx::Error::PoolTimedOut, sqlx::Error::Protocol("cut".into())] {
            assert!(StoreError::Db(e).is_transient());
        }
        let decode = sqlx::Error::Decode("not a state".into());
        let not_found = sqlx::Error::ColumnNotFound("state".into());
        for e in [sqlx::Error::RowNotFound, decode, not_found] {
            assert!(!StoreError::Db(e).is_transient(), "retried");
        }
    }
}
