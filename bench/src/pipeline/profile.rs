//! What one turn costs besides CPU (docs/benchmarks.md, "Profile of a turn"): the AMQP methods
//! the pipeline process sends (its own counters, `aptix_amqp_methods`), the PostgreSQL
//! transactions of the benchmark's database (`pg_stat_database`), and, when the server loads
//! `pg_stat_statements`, every statement with its calls and WAL bytes.

use std::collections::BTreeMap;

use serde::Serialize;

/// AMQP methods counted.
const METHODS: [&str; 9] = [
    "basic.publish",
    "basic.ack",
    "basic.nack",
    "queue.declare",
    "queue.bind",
    "exchange.declare",
    "channel.open",
    "channel.close",
    "confirm.select",
];

/// One statement's counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Statement {
    /// Executions.
    pub calls: f64,
    /// WAL bytes it wrote.
    pub wal_bytes: f64,
    /// Time spent executing it, ms.
    pub exec_ms: f64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Profile {
    /// AMQP methods by name.
    pub amqp: BTreeMap<&'static str, f64>,
    /// Committed transactions of the database.
    pub commits: f64,
    /// Statements by text (empty without `pg_stat_statements`).
    pub statements: BTreeMap<String, Statement>,
}

impl Profile {
    /// Reads every counter.
    pub async fn take(pool: &sqlx::PgPool) -> Profile {
        let m = aptix::metrics::metrics();
        let amqp = METHODS.iter().map(|&k| (k, m.amqp_count(k) as f64)).collect();
        let commits: f64 = sqlx::query_scalar(
            "SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap_or_default();
        let rows: Vec<(String, f64, f64, f64)> = sqlx::query_as(
            "SELECT query, calls::float8, wal_bytes::float8, total_exec_time FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        let statements = rows
            .into_iter()
            .map(|(q, calls, wal_bytes, exec_ms)| (q, Statement { calls, wal_bytes, exec_ms }))
            .collect();
        Profile { amqp, commits, statements }
    }

    /// Per turn, of what happened since `earlier`, over `turns` turns.
    pub fn per_turn(&self, earlier: &Profile, turns: usize) -> Profile {
        let n = turns.max(1) as f64;
        let amqp =
            self.amqp.iter().map(|(k, v)| (*k, (v - earlier.amqp.get(k).unwrap_or(&0.0)) / n));
        let statements = self.statements.iter().filter_map(|(q, s)| {
            let e = earlier.statements.get(q).cloned().unwrap_or_default();
            let calls = (s.calls - e.calls) / n;
            (calls > 0.0).then(|| {
                let wal_bytes = (s.wal_bytes - e.wal_bytes) / n;
                (q.clone(), Statement { calls, wal_bytes, exec_ms: (s.exec_ms - e.exec_ms) / n })
            })
        });
        Profile {
            amqp: amqp.filter(|(_, v)| *v > 0.0).collect(),
            commits: (self.commits - earlier.commits) / n,
            statements: statements.collect(),
        }
    }
}

/// Makes `pg_stat_statements` readable in the benchmark's database when the server loads it
/// (`shared_preload_libraries`); otherwise the statement table stays empty.
pub async fn enable_statements(pool: &sqlx::PgPool) {
    let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(pool).await;
}
