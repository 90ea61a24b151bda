//! An invocation's hold on a reprocess run (`aptix reprocess`, each arm of `aptix eval`): a
//! connection of its own, out of the pool, holding a session advisory lock on the run's id.
//!
//! Two invocations of one run at once would both find a turn not done and both pay for its
//! model call (only the insert keeps one), and a second one with other options could record
//! them over the first's before either wrote a record: the second is refused instead. The lock
//! is the connection's, so a process that dies lets it go with its socket. The connection has
//! no statement timeout: a run's selection and its comparison each read the whole run in one
//! statement, which at millions of records outlasts the pool's 15 s.

use futures_util::TryStreamExt as _;
use sqlx::{Connection as _, PgConnection};

use super::eval::{eval_rows_each, unreached_originals, EvalRow};
use super::reprocess::{select_turns, SelectedTurn, TurnSelector};
use super::{Store, StoreError};

/// The run this invocation holds; dropping it closes the connection, which lets the run go.
#[derive(Debug)]
pub struct RunHold {
    conn: PgConnection,
    run: String,
}

impl Store {
    /// Holds reprocess run `run` for this invocation, or `None` when another invocation (of any
    /// process, on any machine using this database) holds it.
    pub async fn hold_run(&self, run: &str) -> Result<Option<RunHold>, StoreError> {
        let mut conn = self.long_connection().await?;
        let held = sqlx::query_scalar!(
            r#"SELECT pg_try_advisory_lock(hashtextextended('aptix.reprocess-run:' || $1, 0))
                   AS "held!""#,
            run
        )
        .fetch_one(&mut conn)
        .await?;
        if !held {
            let _ = conn.close().await;
            return Ok(None);
        }
        Ok(Some(RunHold { conn, run: run.to_owned() }))
    }
}

impl RunHold {
    /// Lets the run go now, rather than when PostgreSQL notices the dropped connection (the
    /// next invocation of the run, started right after, would be refused meanwhile).
    pub async fn release(mut self) {
        let run = self.run.as_str();
        let _ = sqlx::query!(
            r#"SELECT pg_advisory_unlock(hashtextextended('aptix.reprocess-run:' || $1, 0))
                   AS "released!""#,
            run
        )
        .fetch_one(&mut self.conn)
        .await;
        let _ = self.conn.close().await;
    }

    /// The stored turns matching `selector`, oldest first, each marked done when this run has
    /// its first record.
    pub async fn select(
        &mut self,
        selector: &TurnSelector,
    ) -> Result<Vec<SelectedTurn>, StoreError> {
        select_turns(&mut self.conn, selector, &self.run).await
    }

    /// Records that the run reprocesses with `model` and `context` (none: each turn's own),
    /// unless it has records made with others; then returns what those were made with. A run
    /// that wrote nothing yet (every call refused: a mistyped model) takes the new options.
    pub async fn claim(
        &mut self,
        model: Option<&str>,
        context: Option<&str>,
    ) -> Result<Option<(Option<String>, Option<String>)>, StoreError> {
        let run = self.run.as_str();
        sqlx::query!(
            "INSERT INTO reprocess_runs (run, model, conversation_context_id) VALUES ($1, $2, $3)
             ON CONFLICT (run) DO UPDATE
                 SET model = $2, conversation_context_id = $3, started_at = now()
                 WHERE NOT EXISTS (SELECT 1 FROM response_records
                                   WHERE reprocess_run = $1 AND reprocess_of IS NOT NULL)",
            run,
            model,
            context
        )
        .execute(&mut self.conn)
        .await?;
        let was = sqlx::query!(
            "SELECT model, conversation_context_id FROM reprocess_runs WHERE run = $1",
            run
        )
        .fetch_one(&mut self.conn)
        .await?;
        let same =
            was.model.as_deref() == model && was.conversation_context_id.as_deref() == context;
        Ok((!same).then_some((was.model, was.conversation_context_id)))
    }

    /// Every record the run wrote, with its original, oldest original first, one at a time as
    /// PostgreSQL sends them: a comparison of a large run holds one pair at a time.
    pub fn eval_rows_each(
        &mut self,
    ) -> impl futures_util::Stream<Item = Result<EvalRow, StoreError>> + Send + '_ {
        eval_rows_each(&mut self.conn, &self.run).map_err(StoreError::from)
    }

    /// [`RunHold::eval_rows_each`], collected, and the original round trips of the same turns
    /// the run never reached, with no new record (`new_id` nil): a baseline of the originals
    /// holds every round trip of the turns replayed, not only those some replay reached.
    pub async fn eval_rows(&mut self) -> Result<Vec<EvalRow>, StoreError> {
        let mut rows: Vec<EvalRow> = self.eval_rows_each().try_collect().await?;
        rows.extend(unreached_originals(&mut self.conn, &self.run).await?);
        Ok(rows)
    }
}
