//! Immutable response records, and finishing a round trip: record, session state, turn
//! transition, reply and next-turn dispatch in one transaction.

use serde::Serialize;
use serde_json::{json, Value};
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::outbox::{self, PendingOutbox};
use super::turns::{dispatch_next, starts, TurnRow, TurnState, TURN_COLUMNS};
use super::texts::{TextCache, Texts};
use super::{tool_refs, KnownTexts, Store, StoreError};
use crate::assemble::Assembled;
use crate::contracts::{ApiError, TurnKey, UserTurn};
use crate::llm::RequestBody;
use crate::messages::Outgoing;

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
    pub request_payload: Option<RequestBody>,
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
    /// The round trip's path through the stages (`messages::hops`, stored form).
    pub stage_timings: Option<Value>,
}

impl NewRecord {
    /// A record's fields that come from the turn and what was sent; the outcome's fields empty.
    /// Shared by the persist stage and reprocessing, whose records must read alike.
    pub fn base(
        turn: Option<&UserTurn>,
        assembled: Option<&Assembled>,
        kind: &str,
        reply: Value,
    ) -> Result<NewRecord, serde_json::Error> {
        crate::metrics::metrics().json("serialize", "record");
        let sent = assembled.map(|a| &a.record);
        let list = |v: Option<Value>| v.unwrap_or_else(|| json!([]));
        Ok(NewRecord {
            kind: kind.to_owned(),
            provider_response_id: None,
            chain: sent
                .map(|r| serde_json::to_value(&r.chain))
                .transpose()?
                .unwrap_or_else(|| json!({})),
            request_payload: assembled.map(|a| a.body.clone()),
            response_payload: None,
            retrieved_chunks: list(sent.map(|r| serde_json::to_value(&r.chunks)).transpose()?),
            active_files: list(sent.map(|r| serde_json::to_value(&r.files)).transpose()?),
            skipped_files: list(sent.map(|r| serde_json::to_value(&r.skipped_files)).transpose()?),
            usage: None,
            errors: json!([]),
            instruction: turn.and_then(|t| t.instruction().map(str::to_owned)),
            workspace_id: turn.and_then(|t| t.workspace_id().map(str::to_owned)),
            repo: turn.and_then(|t| t.repo().map(str::to_owned)),
            language: turn.and_then(|t| t.language().map(str::to_owned)),
            rag_scope: list(turn.map(|t| serde_json::to_value(t.rag_scope())).transpose()?),
            reply,
            stage_timings: None,
        })
    }

    /// The record of a step that failed with `errors` before any request was built.
    pub fn failure(
        errors: &[ApiError],
        reply: Value,
        request_payload: Option<RequestBody>,
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
        /// The ordered client calls, as JSON.
        pending: Value,
        /// Warnings so far, owed to the final response.
        warnings: Value,
        /// Server calls of the same answer, run when the client's results come.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
    },
    /// The answer called only server tools: the turn runs on (no reply), starting its next
    /// round trip where they run.
    ServerTools {
        /// The calls to run.
        server_calls: Value,
        /// The turn's server executions so far.
        executed: Value,
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
    /// Texts the state it was built from referenced: already stored, not sent again.
    pub known_texts: KnownTexts,
    /// The turn's transition.
    pub outcome: StepOutcome,
    /// Messages to publish after the commit (the reply).
    pub messages: Vec<Outgoing>,
    /// Whether it ends the turn as cancelled (its client's cancel was admitted).
    pub cancelled: bool,
}

/// What finishing a round trip did.
#[derive(Debug)]
pub enum Finished {
    /// Committed; its messages (or, for a repeat, the turn's unpublished ones) are here.
    Done(PendingOutbox),
    /// Nothing written: a cancel of the turn was admitted, so the round trip must end as
    /// cancelled instead ([`FinishStep::cancelled`]).
    CancelRequested,
}

/// Inserts a record, its tool definitions by reference ([`super::tool_refs`]); returns the texts
/// it stored, to remember once the transaction commits.
pub(super) async fn insert_record(
    conn: &mut PgConnection,
    cache: &TextCache,
    key: (Uuid, &str, i32),
    r: &NewRecord,
) -> Result<Texts, StoreError> {
    let mut texts = Texts::default();
    let request = match &r.request_payload {
        Some(b) => Some(tool_refs::body_by_ref(b.as_raw(), &mut texts)?),
        None => None,
    };
    let request = r.request_payload.as_ref().zip(request).map(|(b, packed)| match packed {
        Some(packed) => Json(packed),
        None => Json(b.as_raw().to_owned()),
    });
    let mut response = r.response_payload.clone();
    if let Some(response) = response.as_mut() {
        tool_refs::value_by_ref(response, &mut texts)?;
    }
    texts.retain(|sha| !cache.holds(sha));
    texts.sort();
    sqlx::query(
        "WITH texts AS (
             INSERT INTO session_texts (sha256, body)
             SELECT * FROM unnest($21::text[], $22::text[]) ON CONFLICT (sha256) DO NOTHING)
         INSERT INTO response_records (id, session_id, turn_id, step, kind, provider_response_id, chain,
            request_payload, response_payload, retrieved_chunks, active_files, skipped_files, usage, errors,
            instruction, workspace_id, repo, language, rag_scope, reply, stage_timings)
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$23)",
    )
    .bind(Uuid::now_v7())
    .bind(key.0)
    .bind(key.1)
    .bind(key.2)
    .bind(&r.kind)
    .bind(&r.provider_response_id)
    .bind(&r.chain)
    .bind(request)
    .bind(response)
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
    .bind(&texts.keys)
    .bind(&texts.bodies)
    .bind(&r.stage_timings)
    .execute(&mut *conn)
    .await?;
    Ok(texts)
}

impl Store {
    /// Ends a round trip in one transaction. Idempotent: if its record already exists, nothing
    /// changes and the turn's unpublished outbox rows are returned for publishing.
    pub async fn finish_step(&self, mut f: FinishStep) -> Result<Finished, StoreError> {
        let (session, turn) = (f.key.session_id.as_uuid(), f.key.turn_id.as_str());
        let mut tx = self.pool.begin().await?;
        // The session's name and expiry, for the reply, are read with the lock.
        let (tenant, name, expires): (Option<String>, Option<String>, Option<_>) = sqlx::query_as(
            "SELECT tenant, name, expires_at FROM sessions WHERE id = $1 FOR UPDATE",
        )
        .bind(session)
        .fetch_one(&mut *tx)
        .await?;
        match step_state(&mut tx, session, turn, f.step).await? {
            StepState::Recorded => {
                let pending = outbox::pending_for_turn(&mut tx, session, turn).await?;
                tx.commit().await?;
                return Ok(Finished::Done(pending));
            }
            StepState::Running { cancelled: true } if !f.cancelled => {
                return Ok(Finished::CancelRequested);
            }
            StepState::Running { .. } => {}
        }
        let stored = insert_record(&mut tx, &self.texts, (session, turn, f.step), &f.record).await?;
        let gate = self.gate(tenant.as_deref());
        if let Some(g) = &gate {
            super::tenants::charge_tokens(&mut tx, g.tenant.as_str(), f.record.usage.as_ref())
                .await?;
        }
        if let Some(state) = f.session_state.take() {
            let state = super::texts::pack(&mut tx, &self.texts, state, &f.known_texts).await?;
            sqlx::query("UPDATE sessions SET state = $2, updated_at = now() WHERE id = $1")
                .bind(session)
                .bind(&state)
                .execute(&mut *tx)
                .await?;
        }
        let mut messages = std::mem::take(&mut f.messages);
        match transition(&mut tx, &f).await? {
            After::Ended => {
                messages.extend(starts(&dispatch_next(&mut tx, session, gate.as_ref()).await?)?);
            }
            After::Waits => {}
            After::RunsOn(row) => messages.push(Outgoing::Start(row.start_job()?)),
        }
        let model = Some((name, expires));
        let out = outbox::insert_with(&mut tx, session, turn, messages, model).await?;
        tx.commit().await?;
        self.texts.keep(&stored);
        Ok(Finished::Done(out))
    }
}

/// Where a round trip stands when persist offers its ending.
enum StepState {
    /// It already has its record (a redelivered or duplicated persist message).
    Recorded,
    /// The turn runs this step; whether a cancel of it was admitted.
    Running {
        /// A cancel was admitted while it ran.
        cancelled: bool,
    },
}

/// Where round trip `step` stands, in one query (the session is locked); a step for a turn that
/// is not running at that step, and has no record, is refused.
async fn step_state(
    conn: &mut PgConnection,
    session: Uuid,
    turn: &str,
    step: i32,
) -> Result<StepState, StoreError> {
    let (recorded, state, at, cancelled): (bool, Option<String>, Option<i32>, Option<bool>) =
        sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM response_records WHERE session_id = $1
                            AND turn_id = $2 AND step = $3 AND reprocess_of IS NULL),
                    t.state, t.step, t.cancel_requested_at IS NOT NULL
             FROM (SELECT 1) AS one
             LEFT JOIN turns t ON t.session_id = $1 AND t.turn_id = $2",
        )
        .bind(session)
        .bind(turn)
        .bind(step)
        .fetch_one(&mut *conn)
        .await?;
    if recorded {
        return Ok(StepState::Recorded);
    }
    let current = match (state, at) {
        (Some(s), Some(n)) => Some((TurnState::try_from(s)?, n)),
        _ => None,
    };
    match current {
        Some((TurnState::Running, n)) if n == step => {
            Ok(StepState::Running { cancelled: cancelled.unwrap_or(false) })
        }
        other => {
            let state =
                other.map_or_else(|| "unknown".to_owned(), |(s, n)| format!("{s} at step {n}"));
            Err(StoreError::NotRunning { turn: turn.to_owned(), step, state })
        }
    }
}

/// What a step's transition leaves to do.
enum After {
    /// The turn ended: the session goes to its next turn.
    Ended,
    /// The turn waits for the client's tool results and keeps the session.
    Waits,
    /// The turn runs on: this is its next round trip's start.
    RunsOn(TurnRow),
}

/// Moves the turn past the step.
async fn transition(conn: &mut PgConnection, f: &FinishStep) -> Result<After, StoreError> {
    let null = Value::Null;
    let (state, pending, warnings, server_calls, executed) = match &f.outcome {
        StepOutcome::Completed => (TurnState::Completed, &null, &null, &null, None),
        StepOutcome::Failed => (TurnState::Failed, &null, &null, &null, None),
        StepOutcome::AwaitingToolResults { pending, warnings, server_calls, executed } => {
            (TurnState::AwaitingToolResults, pending, warnings, server_calls, Some(executed))
        }
        StepOutcome::ServerTools { server_calls, executed, warnings } => {
            (TurnState::Running, &null, warnings, server_calls, Some(executed))
        }
    };
    let runs_on = matches!(f.outcome, StepOutcome::ServerTools { .. });
    let sql = format!(
        "UPDATE turns SET state = $3, step = $4, pending_tool_calls = $5, last_reply = NULL,
             pending_warnings = $6, server_calls = $7,
             server_executions = COALESCE($9, server_executions),
             continuation = CASE WHEN $8 THEN NULL ELSE continuation END, updated_at = now()
         WHERE session_id = $1 AND turn_id = $2 RETURNING {TURN_COLUMNS}"
    );
    let some = |v: &Value| (!v.is_null()).then(|| v.clone());
    let row: TurnRow = sqlx::query_as(&sql)
        .bind(f.key.session_id.as_uuid())
        .bind(f.key.turn_id.as_str())
        .bind(state.as_str())
        .bind(f.step + 1)
        .bind(some(pending))
        .bind(some(warnings))
        .bind(some(server_calls))
        .bind(runs_on)
        .bind(executed.and_then(some))
        .fetch_one(&mut *conn)
        .await?;
    Ok(match state {
        TurnState::Running => After::RunsOn(row),
        TurnState::AwaitingToolResults => After::Waits,
        _ => After::Ended,
    })
}
