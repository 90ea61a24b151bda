//! A response record as the pipeline writes it: its fields, built alike by persist and
//! reprocessing, and its insert, with the tool definitions kept by reference.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sqlx::PgConnection;
use uuid::Uuid;

use super::json_text::JsonText;
use super::texts::{TextCache, Texts};
use super::{tool_refs, StoreError};
use crate::assemble::Assembled;
use crate::contracts::{ApiError, UserTurn};
use crate::llm::RequestBody;

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
    /// The ConversationContext (mode) the turn ran in.
    pub conversation_context_id: Option<String>,
    /// The versions of the contexts that produced it (`config::content_version`).
    pub context_versions: Option<Value>,
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
            conversation_context_id: turn
                .and_then(|t| t.conversation_context_id().map(|c| c.as_str().to_owned())),
            context_versions: None,
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

/// A statement that writes a record, checked at compile time: `$head`, then the CTEs `texts`
/// (the texts it references, new ones only) and `recorded` (its row), then `$tail`; the
/// record's parameters are `$1` to `$25` ([`RecordParams`], bound here in order), the
/// statement's own follow as `$extra`. `$guard` (a WHERE clause, or empty) decides whether
/// the two CTEs write at all. One text of the record's insert for every statement that writes
/// one.
macro_rules! record_query {
    ($mac:ident!($($out:path,)? $head:literal, $guard:literal, $tail:literal), $r:expr
        $(, $extra:expr)* $(,)?) => {{
        let r: &$crate::store::new_record::RecordParams<'_> = $r;
        sqlx::$mac!(
            $($out,)?
            $head
                + "texts AS (
                       INSERT INTO session_texts (sha256, body)
                       SELECT * FROM unnest($21::text[], $22::text[]) "
                + $guard
                + " ON CONFLICT (sha256) DO NOTHING),
                   recorded AS (
                       INSERT INTO response_records (id, session_id, turn_id, step, kind,
                           provider_response_id, chain, request_payload, response_payload,
                           retrieved_chunks, active_files, skipped_files, usage, errors,
                           instruction, workspace_id, repo, language, rag_scope, reply,
                           stage_timings, conversation_context_id, context_versions)
                       SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,
                           $20, $23, $24, $25 "
                + $guard
                + ")"
                + $tail,
            r.id, r.session, r.turn, r.step, r.kind, r.provider_response_id, r.chain,
            r.request as _, r.response as _, r.retrieved_chunks, r.active_files, r.skipped_files,
            r.usage, r.errors, r.instruction, r.workspace_id, r.repo, r.language, r.rag_scope,
            r.reply, r.text_keys, r.text_bodies, r.stage_timings, r.conversation_context_id,
            r.context_versions
            $(, $extra)*
        )
    }};
}
pub(super) use record_query;

/// A record's parameters, `$1` to `$25` of [`record_query`], by name.
pub(crate) struct RecordParams<'a> {
    pub id: Uuid,
    pub session: Uuid,
    pub turn: &'a str,
    pub step: i32,
    pub kind: &'a str,
    pub provider_response_id: Option<&'a str>,
    pub chain: &'a Value,
    /// The body as sent, its tools by reference when it had any.
    pub request: Option<JsonText<&'a RawValue>>,
    pub response: Option<JsonText<&'a Value>>,
    pub retrieved_chunks: &'a Value,
    pub active_files: &'a Value,
    pub skipped_files: &'a Value,
    pub usage: Option<&'a Value>,
    pub errors: &'a Value,
    pub instruction: Option<&'a str>,
    pub workspace_id: Option<&'a str>,
    pub repo: Option<&'a str>,
    pub language: Option<&'a str>,
    pub rag_scope: &'a Value,
    pub reply: &'a Value,
    pub text_keys: &'a [String],
    pub text_bodies: &'a [String],
    pub stage_timings: Option<&'a Value>,
    pub conversation_context_id: Option<&'a str>,
    pub context_versions: Option<&'a Value>,
}

/// A record ready to be written: its tool definitions moved to texts, of which those the cache
/// does not hold go with it.
pub(super) struct PreparedRecord<'r> {
    record: &'r NewRecord,
    key: (Uuid, &'r str, i32),
    /// The body as sent with its tools by reference (`None`: it had none to move).
    packed: Option<Box<RawValue>>,
    response: Option<Value>,
    /// The texts it writes, to remember once the transaction commits.
    pub texts: Texts,
}

impl<'r> PreparedRecord<'r> {
    /// Moves `r`'s tool definitions to texts.
    /// The record `r`, its provider response `response` taken out of it (`r`'s own is not
    /// read: a response is tens of KB, so the caller moves it here rather than have it copied).
    pub(super) fn new(
        cache: &TextCache,
        key: (Uuid, &'r str, i32),
        r: &'r NewRecord,
        mut response: Option<Value>,
    ) -> Result<Self, StoreError> {
        let mut texts = Texts::default();
        let sent = r.request_payload.as_ref().map(RequestBody::as_raw);
        let packed = sent.map(|b| tool_refs::body_by_ref(b, &mut texts)).transpose()?.flatten();
        if let Some(response) = response.as_mut() {
            tool_refs::value_by_ref(response, &mut texts)?;
        }
        texts.retain(|sha| !cache.holds(sha));
        texts.sort();
        Ok(PreparedRecord { record: r, key, packed, response, texts })
    }

    /// Its parameters, for [`record_query`].
    pub(super) fn params(&self) -> RecordParams<'_> {
        let r = self.record;
        let sent = r.request_payload.as_ref().map(RequestBody::as_raw);
        RecordParams {
            id: Uuid::now_v7(),
            session: self.key.0,
            turn: self.key.1,
            step: self.key.2,
            kind: &r.kind,
            provider_response_id: r.provider_response_id.as_deref(),
            chain: &r.chain,
            // The body as sent when it has no tool definitions to move.
            request: self.packed.as_deref().or(sent).map(JsonText),
            response: self.response.as_ref().map(JsonText),
            retrieved_chunks: &r.retrieved_chunks,
            active_files: &r.active_files,
            skipped_files: &r.skipped_files,
            usage: r.usage.as_ref(),
            errors: &r.errors,
            instruction: r.instruction.as_deref(),
            workspace_id: r.workspace_id.as_deref(),
            repo: r.repo.as_deref(),
            language: r.language.as_deref(),
            rag_scope: &r.rag_scope,
            reply: &r.reply,
            text_keys: &self.texts.keys,
            text_bodies: &self.texts.bodies,
            stage_timings: r.stage_timings.as_ref(),
            conversation_context_id: r.conversation_context_id.as_deref(),
            context_versions: r.context_versions.as_ref(),
        }
    }
}

/// Inserts a record, its tool definitions by reference ([`super::tool_refs`]); returns the texts
/// it stored, to remember once the transaction commits.
pub(super) async fn insert_record(
    conn: &mut PgConnection,
    cache: &TextCache,
    key: (Uuid, &str, i32),
    r: &NewRecord,
) -> Result<Texts, StoreError> {
    let prepared = PreparedRecord::new(cache, key, r, r.response_payload.clone())?;
    record_query!(query!("WITH ", "", " SELECT 1 AS one"), &prepared.params())
        .fetch_one(&mut *conn)
        .await?;
    Ok(prepared.texts)
}
