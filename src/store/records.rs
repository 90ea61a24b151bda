//! Turn rows, immutable response records, and finishing a round trip: record, session state,
//! turn transition, reply and next-turn dispatch in one transaction.

use serde::Serialize;
use serde_json::{json, Value};
use sqlx::{FromRow, PgConnection};
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::{Store, StoreError};
use crate::assemble::Assembled;
use crate::contracts::{ApiError, SessionId, TurnKey, UserTurn};
use crate::messages::{Outgoing, TurnJob};

/// Where a turn stands (the `turns.state` column; its CHECK constraint allows only these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Waits behind the session's active turn.
    Queued,
    /// Holds the session and moves through the stages.
    Running,
    /// Holds the session until the client sends tool results.
    AwaitingToolResults,
    /// Ended with a final answer.
    Completed,
    /// Ended with an error reply.
    Failed,
}

impl TurnState {
    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnState::Queued => "queued",
            TurnState::Running => "running",
            TurnState::AwaitingToolResults => "awaiting_tool_results",
            TurnState::Completed => "completed",
            TurnState::Failed => "failed",
        }
    }

    /// Whether the turn has ended.
    pub fn is_finished(self) -> bool {
        matches!(self, TurnState::Completed | TurnState::Failed)
    }
}

impl std::fmt::Display for TurnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for TurnState {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Self, StoreError> {
        serde_json::from_value(serde_json::Value::String(s)).map_err(StoreError::Corrupt)
    }
}

/// A row of `turns`.
#[derive(Debug, Clone, FromRow, Serialize)]
pub struct TurnRow {
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// Arrival order within the session.
    pub seq: i64,
    /// Where the turn stands.
    #[sqlx(try_from = "String")]
    pub state: TurnState,
    /// Fingerprint of the admitted request.
    pub fingerprint: String,
    /// The validated request (wire form).
    pub request: Value,
    /// Round trips done.
    pub step: i32,
    /// Tool calls the client must answer, while awaiting.
    pub pending_tool_calls: Option<Value>,
    /// Warnings owed to the turn's final response.
    pub pending_warnings: Option<Value>,
    /// The last reply sent for this turn.
    pub last_reply: Option<Value>,
    /// The continuation that resumed the turn, if any.
    pub continuation: Option<Value>,
    /// Its fingerprint.
    pub continuation_fingerprint: Option<String>,
}

impl TurnRow {
    /// The turn's key.
    pub fn key(&self) -> Result<TurnKey, StoreError> {
        let turn_id = self
            .turn_id
            .parse()
            .map_err(|(_, e)| StoreError::Corrupt(serde::de::Error::custom(format!("stored TurnId: {e}"))))?;
        Ok(TurnKey { session_id: SessionId::new(self.session_id), turn_id })
    }

    /// The message that starts (or resumes) this turn at its current step. The request is read
    /// back from PostgreSQL, so it is checked here, once, as it leaves the store.
    pub fn start_job(&self) -> Result<TurnJob, StoreError> {
        let decode = |v: &Value| {
            crate::rules::from_stored(v).map_err(|e| StoreError::Corrupt(serde::de::Error::custom(e)))
        };
        Ok(TurnJob {
            key: self.key()?,
            step: self.step,
            turn: decode(&self.request)?,
            continuation: self.continuation.as_ref().map(decode).transpose()?,
            pending_tool_calls: self
                .pending_tool_calls
                .clone()
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default(),
            admitted_at: chrono::Utc::now(),
            carried_warnings: self
                .pending_warnings
                .clone()
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

pub(super) const TURN_COLUMNS: &str = "session_id, turn_id, seq, state, fingerprint, request, step, pending_tool_calls, pending_warnings, last_reply, continuation, continuation_fingerprint";

/// A response record to insert. Records are never updated or deleted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewRecord {
    /// `final`, `client_tool_continuation` or `error`.
    pub kind: String,
    /// Provider response id.
    pub provider_response_id: Option<String>,
    /// New / continued / rehydrated chain, and why.
    pub chain: Value,
    /// The `/responses` body sent.
    pub request_payload: Option<Value>,
    /// The provider's response.
    pub response_payload: Option<Value>,
    /// Chunk ids with path and lines.
    pub retrieved_chunks: Value,
    /// Active files with hashes.
    pub active_files: Value,
    /// Files not sent, and why.
    pub skipped_files: Value,
    /// Token usage.
    pub usage: Option<Value>,
    /// Errors of a failed step.
    pub errors: Value,
    /// The turn's instruction.
    pub instruction: Option<String>,
    /// Workspace hint.
    pub workspace_id: Option<String>,
    /// Repository hint.
    pub repo: Option<String>,
    /// Language hint.
    pub language: Option<String>,
    /// Retrieval scope.
    pub rag_scope: Value,
    /// The reply sent to the client.
    pub reply: Value,
}

impl NewRecord {
    /// A record's fields that come from the turn and what was sent; the outcome's fields empty.
    /// Shared by the persist stage and reprocessing, whose records must read alike.
    pub fn base(
        turn: Option<&UserTurn>,
        assembled: Option<&Assembled>,
        kind: &str,
        reply: Value,
    ) -> NewRecord {
        let sent = assembled.map(|a| &a.record);
        let to = |v: Option<Value>| v.unwrap_or_else(|| json!([]));
        NewRecord {
            kind: kind.to_owned(),
            provider_response_id: None,
            chain: sent
                .map(|r| serde_json::to_value(&r.chain).unwrap_or_default())
                .unwrap_or_else(|| json!({})),
            request_payload: assembled.map(|a| a.body.clone()),
            response_payload: None,
            retrieved_chunks: to(sent.and_then(|r| serde_json::to_value(&r.chunks).ok())),
            active_files: to(sent.and_then(|r| serde_json::to_value(&r.files).ok())),
            skipped_files: to(sent.and_then(|r| serde_json::to_value(&r.skipped_files).ok())),
            usage: None,
            errors: json!([]),
            instruction: turn.and_then(|t| t.instruction().map(str::to_owned)),
            workspace_id: turn.and_then(|t| t.workspace_id().map(str::to_owned)),
            repo: turn.and_then(|t| t.repo().map(str::to_owned)),
            language: turn.and_then(|t| t.language().map(str::to_owned)),
            rag_scope: turn
                .map_or_else(|| json!([]), |t| serde_json::to_value(t.rag_scope()).unwrap_or_default()),
            reply,
        }
    }

    /// The record of a step that failed with `errors` before any request was built.
    pub fn failure(
        errors: &[ApiError],
        reply: Value,
        request_payload: Option<Value>,
    ) -> Result<Self, StoreError> {
        Ok(NewRecord {
            kind: "error".into(),
            errors: serde_json::to_value(errors)?,
            reply,
            request_payload,
            chain: serde_json::json!({}),
            retrieved_chunks: serde_json::json!([]),
            active_files: serde_json::json!([]),
            skipped_files: serde_json::json!([]),
            rag_scope: serde_json::json!([]),
            ..NewRecord::default()
        })
    }
}

/// How a round trip leaves its turn.
#[derive(Debug, Clone)]
pub enum StepOutcome {
    /// A final answer: the turn is done and the session free.
    Completed,
    /// An error reply: the turn is done and the session free.
    Failed,
    /// Tool calls went to the client; the turn holds the session until results come.
    AwaitingToolResults {
        /// The ordered calls, as JSON.
        pending: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
    },
}

/// Everything persisted when a round trip ends.
#[derive(Debug)]
pub struct FinishStep {
    /// The turn.
    pub key: TurnKey,
    /// Which round trip (0 for the user turn, +1 per continuation).
    pub step: i32,
    /// The immutable record.
    pub record: NewRecord,
    /// The session's new assemble state, when it changed.
    pub session_state: Option<Value>,
    /// The turn's transition.
    pub outcome: StepOutcome,
    /// Messages to publish after the commit (the reply).
    pub messages: Vec<Outgoing>,
}

pub(super) async fn insert_record(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    step: i32,
    r: &NewRecord,
    reprocess: Option<(Uuid, &str)>,
) -> Result<Uuid, StoreError> {
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO response_records (id, session_id, turn_id, step, kind, provider_response_id, chain,
            request_payload, response_payload, retrieved_chunks, active_files, skipped_files, usage, errors,
            instruction, workspace_id, repo, language, rag_scope, reply, reprocess_of, reprocess_run)
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22)",
    )
    .bind(id)
    .bind(session)
    .bind(turn)
    .bind(step)
    .bind(&r.kind)
    .bind(&r.provider_response_id)
    .bind(&r.chain)
    .bind(&r.request_payload)
    .bind(&r.response_payload)
    .bind(&r.retrieved_chunks)
    .bind(&r.active_files)
    .bind(&r.skipped_files)
    .bind(&r.usage)
    .bind(&r.errors)
    .bind(&r.instruction)
    .bind(&r.workspace_id)
    .bind(&r.repo)
    .bind(&r.language)
    .bind(&r.rag_scope)
    .bind(&r.reply)
    .bind(reprocess.map(|(of, _)| of))
    .bind(reprocess.map(|(_, run)| run))
    .execute(&mut *conn)
    .await?;
    Ok(id)
}

/// Marks the next queued turn of a locked session running and returns it.
pub(super) async fn dispatch_next(
    conn: &mut PgConnection,
    session: Uuid,
) -> Result<Option<TurnRow>, StoreError> {
    let sql = format!(
        "UPDATE turns SET state = 'running', updated_at = now()
         WHERE (session_id, turn_id) = (SELECT session_id, turn_id FROM turns
                WHERE session_id = $1 AND state = 'queued' ORDER BY seq LIMIT 1)
         RETURNING {TURN_COLUMNS}"
    );
    let next: Option<TurnRow> = sqlx::query_as(&sql).bind(session).fetch_optional(&mut *conn).await?;
    sqlx::query("UPDATE sessions SET active_turn_id = $2, updated_at = now() WHERE id = $1")
        .bind(session)
        .bind(next.as_ref().map(|t| t.turn_id.clone()))
        .execute(&mut *conn)
        .await?;
    Ok(next)
}

impl Store {
    /// Ends a round trip in one transaction. Idempotent: if its record already exists, nothing
    /// changes and the turn's unpublished outbox rows are returned for publishing.
    pub async fn finish_step(&self, f: FinishStep) -> Result<PendingOutbox, StoreError> {
        let session = f.key.session_id.as_uuid();
        let turn = f.key.turn_id.as_str();
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
            .bind(session)
            .execute(&mut *tx)
            .await?;
        let done: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM response_records WHERE session_id = $1 AND turn_id = $2 AND step = $3 AND reprocess_of IS NULL",
        )
        .bind(session)
        .bind(turn)
        .bind(f.step)
        .fetch_optional(&mut *tx)
        .await?;
        if done.is_some() {
            let pending = outbox::pending_for_turn(&mut tx, session, turn).await?;
            tx.commit().await?;
            return Ok(pending);
        }
        let current: Option<(String, i32)> =
            sqlx::query_as("SELECT state, step FROM turns WHERE session_id = $1 AND turn_id = $2")
                .bind(session)
                .bind(turn)
                .fetch_optional(&mut *tx)
                .await?;
        let current = current.map(|(s, n)| TurnState::try_from(s).map(|s| (s, n))).transpose()?;
        match current {
            Some((TurnState::Running, step)) if step == f.step => {}
            other => {
                let state = other.map_or_else(|| "unknown".to_owned(), |(s, n)| format!("{s} at step {n}"));
                return Err(StoreError::NotRunning { turn: turn.to_owned(), step: f.step, state });
            }
        }
        insert_record(&mut tx, session, turn, f.step, &f.record, None).await?;
        if let Some(state) = &f.session_state {
            sqlx::query("UPDATE sessions SET state = $2, updated_at = now() WHERE id = $1")
                .bind(session)
                .bind(state)
                .execute(&mut *tx)
                .await?;
        }
        let (state, pending, warnings) = match &f.outcome {
            StepOutcome::Completed => (TurnState::Completed, None, None),
            StepOutcome::Failed => (TurnState::Failed, None, None),
            StepOutcome::AwaitingToolResults { pending, warnings } => {
                (TurnState::AwaitingToolResults, Some(pending.clone()), Some(warnings.clone()))
            }
        };
        sqlx::query(
            "UPDATE turns SET state = $3, step = $4, pending_tool_calls = $5, last_reply = $6, pending_warnings = $7,
                 updated_at = now()
             WHERE session_id = $1 AND turn_id = $2",
        )
        .bind(session)
        .bind(turn)
        .bind(state.as_str())
        .bind(f.step + 1)
        .bind(&pending)
        .bind(&f.record.reply)
        .bind(&warnings)
        .execute(&mut *tx)
        .await?;
        let mut messages = f.messages;
        if pending.is_none() {
            if let Some(next) = dispatch_next(&mut tx, session).await? {
                messages.push(Outgoing::Start(next.start_job()?));
            }
        }
        let out = outbox::insert(&mut tx, session, turn, messages).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// A turn row.
    pub async fn turn(&self, key: &TurnKey) -> Result<Option<TurnRow>, StoreError> {
        let sql = format!("SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND turn_id = $2");
        Ok(sqlx::query_as(&sql)
            .bind(key.session_id.as_uuid())
            .bind(key.turn_id.as_str())
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The session's assemble state (`{}` for a new session).
    pub async fn session_state(&self, session: &SessionId) -> Result<Value, StoreError> {
        let state: Option<Value> = sqlx::query_scalar("SELECT state FROM sessions WHERE id = $1")
            .bind(session.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
        Ok(state.unwrap_or_else(|| Value::Object(Default::default())))
    }

    /// A stored provider answer for a round trip, if the call already completed.
    pub async fn llm_result(&self, key: &TurnKey, step: i32) -> Result<Option<Value>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT result FROM llm_results WHERE session_id = $1 AND turn_id = $2 AND step = $3",
        )
        .bind(key.session_id.as_uuid())
        .bind(key.turn_id.as_str())
        .bind(step)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Keeps a provider answer before it is forwarded; the first one written wins.
    pub async fn save_llm_result(&self, key: &TurnKey, step: i32, result: &Value) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO llm_results (session_id, turn_id, step, result) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(key.session_id.as_uuid())
        .bind(key.turn_id.as_str())
        .bind(step)
        .bind(result)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// A session with its turns and records, for `aptix session show`.
#[derive(Debug, Serialize)]
pub struct SessionView {
    /// The session row.
    pub session: Value,
    /// Its turns, in arrival order.
    pub turns: Vec<Value>,
    /// Its records, oldest first.
    pub records: Vec<Value>,
    /// Refusals sent to it (replies that answered a submission, not a step), oldest first.
    pub replies: Vec<Value>,
}

impl Store {
    /// Everything stored about a session, or `None` if it does not exist.
    pub async fn session_view(&self, session: &SessionId) -> Result<Option<SessionView>, StoreError> {
        let id = session.as_uuid();
        let row: Option<Value> = sqlx::query_scalar("SELECT to_jsonb(s) FROM sessions s WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(session) = row else { return Ok(None) };
        let turns = sqlx::query_scalar("SELECT to_jsonb(t) FROM turns t WHERE session_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let records = sqlx::query_scalar(
            "SELECT to_jsonb(r) FROM response_records r WHERE session_id = $1 ORDER BY created_at, id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let replies = self.session_replies(id).await?;
        Ok(Some(SessionView { session, turns, records, replies }))
    }
}
