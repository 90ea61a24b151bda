//! What `aptix reprocess`'s comparison and `aptix eval` read, and what eval keeps (README,
//! "Evaluation"): each record a reprocess run wrote, with its original and what the scorers need
//! of both, and the reports of evaluation runs for the console.

use serde_json::Value;
use uuid::Uuid;

use super::{Store, StoreError};

/// One round trip of an arm: the new record and its original.
#[derive(Debug, Clone)]
pub struct EvalRow {
    /// The original record.
    pub original_id: Uuid,
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// Round trip.
    pub step: i32,
    /// The original's kind (`final`, `client_tool_continuation`, `error`, ...).
    pub original_kind: String,
    /// The original's reply.
    pub original_reply: Value,
    /// The original's usage.
    pub original_usage: Option<Value>,
    /// The chunks the original sent.
    pub original_chunks: Option<Value>,
    /// The original's model.
    pub original_model: Option<String>,
    /// The turn's instruction (for the judge).
    pub instruction: Option<String>,
    /// The new record (nil: none, the replay never reached this round trip).
    pub new_id: Uuid,
    /// Its kind.
    pub new_kind: String,
    /// Its reply.
    pub new_reply: Value,
    /// Its usage.
    pub new_usage: Option<Value>,
    /// The chunks it sent.
    pub new_chunks: Option<Value>,
    /// Its model.
    pub new_model: Option<String>,
    /// The tools its request offered (their JSON Schemas).
    pub new_tools: Option<Value>,
    /// Its timings (`llm_ms`: the call's duration).
    pub new_timings: Option<Value>,
}

/// Every record reprocess run `run` wrote, with its original, oldest original first, as
/// PostgreSQL sends them (read through a [`super::RunHold`]'s connection).
pub(super) fn eval_rows_each<'e>(
    conn: &'e mut sqlx::PgConnection,
    run: &'e str,
) -> impl futures_util::Stream<Item = Result<EvalRow, sqlx::Error>> + Send + 'e {
    sqlx::query_as!(
        EvalRow,
        r#"SELECT o.id AS original_id, o.session_id, o.turn_id, o.step,
                  o.kind AS original_kind, o.reply AS original_reply,
                  o.usage AS original_usage, o.retrieved_chunks AS "original_chunks?",
                  o.request_payload->>'model' AS original_model, o.instruction,
                  n.id AS new_id, n.kind AS new_kind, n.reply AS new_reply,
                  n.usage AS new_usage, n.retrieved_chunks AS "new_chunks?",
                  n.request_payload->>'model' AS new_model,
                  aptix_deref_at(n.request_payload, '{tools}')->'tools' AS new_tools,
                  n.stage_timings AS new_timings
           FROM response_records n JOIN response_records o ON o.id = n.reprocess_of
           WHERE n.reprocess_run = $1 AND n.reprocess_of IS NOT NULL
           ORDER BY o.created_at, o.id"#,
        run
    )
    .fetch(conn)
}

/// The original records of the turns run `run` replayed that it has no record of: the round
/// trips its replays never reached (they took another path and ended sooner), as rows with no
/// new record (`new_id` nil), oldest first.
pub(super) async fn unreached_originals(
    conn: &mut sqlx::PgConnection,
    run: &str,
) -> Result<Vec<EvalRow>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"WITH replayed AS (
               SELECT DISTINCT o.session_id, o.turn_id
               FROM response_records n JOIN response_records o ON o.id = n.reprocess_of
               WHERE n.reprocess_run = $1 AND n.reprocess_of IS NOT NULL)
           SELECT o.id, o.session_id, o.turn_id, o.step, o.kind, o.reply, o.usage,
                  o.retrieved_chunks AS "chunks?", o.request_payload->>'model' AS model,
                  o.instruction
           FROM replayed t
           JOIN response_records o
               ON o.session_id = t.session_id AND o.turn_id = t.turn_id AND o.reprocess_of IS NULL
           WHERE NOT EXISTS (SELECT 1 FROM response_records n
                             WHERE n.reprocess_of = o.id AND n.reprocess_run = $1)
           ORDER BY o.created_at, o.id"#,
        run
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|o| EvalRow {
            original_id: o.id,
            session_id: o.session_id,
            turn_id: o.turn_id,
            step: o.step,
            original_kind: o.kind,
            original_reply: o.reply,
            original_usage: o.usage,
            original_chunks: o.chunks,
            original_model: o.model,
            instruction: o.instruction,
            new_id: Uuid::nil(),
            new_kind: String::new(),
            new_reply: Value::Null,
            new_usage: None,
            new_chunks: None,
            new_model: None,
            new_tools: None,
            new_timings: None,
        })
        .collect())
}

impl Store {
    /// Keeps an evaluation run's report (a later invocation of the same run replaces it).
    pub async fn save_eval(&self, run: &str, report: &Value) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO eval_runs (run, report) VALUES ($1, $2)
             ON CONFLICT (run) DO UPDATE SET report = EXCLUDED.report, updated_at = now()",
            run,
            report
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// One evaluation run's report, if it has one.
    pub async fn eval_run(&self, run: &str) -> Result<Option<Value>, StoreError> {
        Ok(sqlx::query_scalar!("SELECT report FROM eval_runs WHERE run = $1", run)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Evaluation runs, newest first: (run, report, last updated).
    pub async fn eval_runs(
        &self,
        limit: i64,
    ) -> Result<Vec<(String, Value, chrono::DateTime<chrono::Utc>)>, StoreError> {
        let rows = sqlx::query!(
            "SELECT run, report, updated_at FROM eval_runs ORDER BY updated_at DESC LIMIT $1",
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.run, r.report, r.updated_at)).collect())
    }
}
