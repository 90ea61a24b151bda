//! Queries of batch reprocessing (`crate::reprocess`): selecting stored turns, reading a turn's
//! original records with the invoke stage's saved inputs (`llm_results`), the session's earlier
//! steps, and writing new records linked to the originals. Nothing here changes sessions, turns,
//! outbox rows or original records.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::new_record::NewRecord;
use super::texts;
use super::{Store, StoreError};

/// Which stored turns a reprocessing run covers. Every condition given must hold.
#[derive(Debug, Clone, Default)]
pub struct TurnSelector {
    /// Only this session.
    pub session: Option<Uuid>,
    /// Turns whose first record was written at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Turns whose first record was written before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only these `(session, turn)` pairs.
    pub turns: Option<Vec<(Uuid, String)>>,
}

/// A selected turn, identified by its first original record.
#[derive(Debug, Clone)]
pub struct SelectedTurn {
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// When the turn's first record (step 0) was written.
    pub created_at: DateTime<Utc>,
    /// The turn's state now: a turn still in flight has only its round trips so far.
    pub turn_state: String,
    /// Its original round trips so far.
    pub round_trips: i64,
    /// Whether the run already has its first record (then it has the whole turn).
    pub done: bool,
}

/// One original record of a turn, with the invoke stage's saved round trip for it.
#[derive(Debug, Clone)]
pub struct OriginalStep {
    /// The record id: what `reprocess_of` points at.
    pub id: Uuid,
    /// Arrival order of the turn within its session.
    pub seq: i64,
    /// Round trip.
    pub step: i32,
    /// `final`, `client_tool_continuation` or `error`.
    pub kind: String,
    /// The `/responses` body sent, if one was.
    pub request_payload: Option<Value>,
    /// Token usage (AGN-033 `Usage`).
    pub usage: Option<Value>,
    /// The reply sent to the client.
    pub reply: Value,
    /// The saved `EndedRoundTrip` of the round trip (`llm_results.result`), when the LLM was called.
    pub saved: Option<Value>,
}

/// A new record and the original it reprocesses.
#[derive(Debug, Clone)]
pub struct LinkedRecord {
    /// The original record's id.
    pub reprocess_of: Uuid,
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// Round trip.
    pub step: i32,
    /// The record.
    pub record: NewRecord,
}

/// The stored turns matching `selector`, oldest first, each marked done when run `run` has its
/// first record. A turn is selected by its step-0 original record; turns that never got one
/// (rejected at admission) are not stored turns.
pub(super) async fn select_turns<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    selector: &TurnSelector,
    run: &str,
) -> Result<Vec<SelectedTurn>, StoreError> {
    let (sessions, turns): (Vec<Uuid>, Vec<String>) =
        selector.turns.iter().flatten().map(|(s, t)| (*s, t.clone())).unzip();
    Ok(sqlx::query_as!(
        SelectedTurn,
        r#"SELECT r.session_id, r.turn_id, r.created_at, t.state AS "turn_state!",
                  (SELECT count(*) FROM response_records s
                   WHERE s.session_id = r.session_id AND s.turn_id = r.turn_id
                     AND s.reprocess_of IS NULL) AS "round_trips!",
                  EXISTS (SELECT 1 FROM response_records n
                          WHERE n.reprocess_of = r.id AND n.reprocess_run = $7) AS "done!"
           FROM response_records r
           JOIN turns t ON t.session_id = r.session_id AND t.turn_id = r.turn_id
           WHERE r.reprocess_of IS NULL AND r.step = 0
             AND ($1::uuid IS NULL OR r.session_id = $1)
             AND ($2::timestamptz IS NULL OR r.created_at >= $2)
             AND ($3::timestamptz IS NULL OR r.created_at < $3)
             AND (NOT $4 OR (r.session_id, r.turn_id) IN (SELECT * FROM unnest($5::uuid[], $6::text[])))
           ORDER BY r.created_at, r.id"#,
        selector.session,
        selector.since,
        selector.until,
        selector.turns.is_some(),
        &sessions,
        &turns,
        run
    )
    .fetch_all(executor)
    .await?)
}

impl Store {
    /// [`select_turns`] on a connection of its own (a dry run, which holds no run).
    pub async fn reprocess_select(
        &self,
        selector: &TurnSelector,
        run: &str,
    ) -> Result<Vec<SelectedTurn>, StoreError> {
        use sqlx::Connection as _;
        let mut conn = self.long_connection().await?;
        let selected = select_turns(&mut conn, selector, run).await;
        let _ = conn.close().await;
        selected
    }

    /// The original records of a turn, by step, each with its saved round trip.
    pub async fn original_steps(
        &self,
        session: Uuid,
        turn: &str,
    ) -> Result<Vec<OriginalStep>, StoreError> {
        let mut steps = sqlx::query_as!(
            OriginalStep,
            "SELECT r.id, t.seq, r.step, r.kind,
                    aptix_deref_at(r.request_payload, '{tools}') AS request_payload,
                    r.usage, r.reply, aptix_deref_at(l.result, '{job,result,raw,tools}') AS saved
             FROM response_records r
             JOIN turns t ON t.session_id = r.session_id AND t.turn_id = r.turn_id
             LEFT JOIN llm_results l
                 ON l.session_id = r.session_id AND l.turn_id = r.turn_id AND l.step = r.step
             WHERE r.session_id = $1 AND r.turn_id = $2 AND r.reprocess_of IS NULL
             ORDER BY r.step",
            session,
            turn
        )
        .fetch_all(&self.pool)
        .await?;
        let mut conn = self.pool.acquire().await?;
        for step in &mut steps {
            if let Some(saved) = step.saved.take() {
                step.saved = Some(texts::read_saved(&mut conn, &self.texts, saved).await?);
            }
        }
        Ok(steps)
    }

    /// A page of the saved round trips of the session's original records of the turns with
    /// arrival order from `from_seq` up to but not including `seq`, in the order the pipeline
    /// applied them: the `limit` after `after` (a turn's order and a step; `None` from the
    /// first), each with its place. A session's history is read a page at a time: a long one
    /// (each round trip tens of KB, up to megabytes with its artifacts) read whole would take
    /// the memory of every tenant's batch and the statement's time.
    pub async fn saved_steps_page(
        &self,
        session: Uuid,
        (from_seq, seq): (i64, i64),
        after: Option<(i64, i32)>,
        limit: i64,
    ) -> Result<Vec<((i64, i32), Value)>, StoreError> {
        let (after_seq, after_step) = after.unwrap_or((i64::MIN, i32::MIN));
        let rows = sqlx::query!(
            r#"SELECT t.seq, r.step,
                      aptix_deref_at(l.result, '{job,result,raw,tools}') AS "saved!"
               FROM response_records r
               JOIN turns t ON t.session_id = r.session_id AND t.turn_id = r.turn_id
               JOIN llm_results l
                   ON l.session_id = r.session_id AND l.turn_id = r.turn_id AND l.step = r.step
               WHERE r.session_id = $1 AND r.reprocess_of IS NULL
                 AND t.seq >= $2 AND t.seq < $3 AND (t.seq, r.step) > ($4, $5)
               ORDER BY t.seq, r.step
               LIMIT $6"#,
            session,
            from_seq,
            seq,
            after_seq,
            after_step,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        let mut conn = self.pool.acquire().await?;
        let mut page = Vec::with_capacity(rows.len());
        for row in rows {
            let saved = texts::read_saved(&mut conn, &self.texts, row.saved).await?;
            page.push(((row.seq, row.step), saved));
        }
        Ok(page)
    }

    /// Writes the records of one reprocessed turn in one transaction. When the run already
    /// wrote one of them (another copy of the run got there first, with the turn's whole path),
    /// none of this copy's is kept, so no turn mixes two paths. Returns how many were written.
    pub async fn insert_reprocessed(
        &self,
        run: &str,
        records: &[LinkedRecord],
    ) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut written = 0;
        for r in records {
            let mut row = serde_json::to_value(&r.record)?;
            if let Value::Object(map) = &mut row {
                map.insert("id".into(), Value::String(Uuid::now_v7().to_string()));
                map.insert("session_id".into(), Value::String(r.session_id.to_string()));
                map.insert("turn_id".into(), Value::String(r.turn_id.clone()));
                map.insert("step".into(), Value::from(r.step));
                map.insert("reprocess_of".into(), Value::String(r.reprocess_of.to_string()));
                map.insert("reprocess_run".into(), Value::String(run.to_owned()));
            }
            // The columns written; the rest take their defaults.
            let done = sqlx::query!(
                "INSERT INTO response_records (id, session_id, turn_id, step, kind,
                     provider_response_id, chain, request_payload, response_payload,
                     retrieved_chunks, active_files, skipped_files, usage, errors, instruction,
                     workspace_id, repo, language, rag_scope, reply, reprocess_of, reprocess_run,
                     conversation_context_id, context_versions, stage_timings)
                 SELECT id, session_id, turn_id, step, kind, provider_response_id, chain,
                     request_payload, response_payload, retrieved_chunks, active_files,
                     skipped_files, usage, errors, instruction, workspace_id, repo, language,
                     rag_scope, reply, reprocess_of, reprocess_run, conversation_context_id,
                     context_versions, stage_timings
                 FROM jsonb_populate_record(NULL::response_records, $1)
                 ON CONFLICT (reprocess_of, reprocess_run) WHERE reprocess_of IS NOT NULL
                 DO NOTHING",
                &row
            )
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(0);
            }
            written += 1;
        }
        tx.commit().await?;
        Ok(written)
    }
}
