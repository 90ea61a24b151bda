//! Validate: raw request bytes in; an admitted turn for retrieve, or an error reply, out.
//! Stateless rules first, then the stateful ones (contexts, idempotency, one turn at a time,
//! tool continuations) inside one database transaction.

use chrono::Utc;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tracing::{debug, info};

use super::{Deps, ReplyOutcome};
use crate::assemble::check_tool_results;
use crate::broker::{Disposition, OutMessage, StageName};
use crate::contracts::{
    ApiError, ErrorCode, InvokeResult, Reply, SessionId, ToolCall, ToolContinuation, UserTurn,
    ValidatedRequest,
};
use crate::messages::StageMessage;
use crate::store::{
    Admission, ContinuationAdmission, NewRecord, SessionMeta, StoreError, StoredReply, TurnRow,
};
use crate::validate::{turn_hint, validate_bytes};

/// Handles one ingress message (`message_id` is the client's, if it set one).
pub async fn run(deps: &Deps, body: &[u8], message_id: Option<&str>) -> Disposition {
    // Replies that answer this submission rather than a turn's step get ids derived from it, so
    // a redelivered message yields the same id and the client can drop the copy.
    let submission = message_fingerprint(message_id, body);
    let request = match validate_bytes(body, &deps.settings.limits) {
        Ok(r) => r,
        Err(errors) => {
            return keep_refusals(deps, message_id, reject(deps, body, &submission, errors.0)).await
        }
    };
    let result = match &request {
        ValidatedRequest::UserTurn(turn) => user_turn(deps, &request, turn, &submission).await,
        ValidatedRequest::ToolContinuation(c) => continuation(deps, &request, c, &submission).await,
    };
    match result {
        Ok(d) => keep_refusals(deps, message_id, d).await,
        Err(e) if e.is_transient() => Disposition::Retry { reason: e.to_string() },
        Err(e) => {
            let reason = format!("stored data unusable: {e}");
            let messages = exhausted(deps, body, message_id, &reason).await;
            Disposition::DeadLetter { reason, messages }
        }
    }
}

/// Stores the replies a disposition sends that answer this submission (refusals and stored
/// replies sent again, not the outbox's), so the database holds every reply a client can
/// receive, and marks them with the request's `message_id` as their `correlation_id`.
async fn keep_refusals(deps: &Deps, message_id: Option<&str>, d: Disposition) -> Disposition {
    let Disposition::Forward { mut messages, outbox_ids } = d else { return d };
    if !outbox_ids.is_empty() {
        return Disposition::Forward { messages, outbox_ids };
    }
    for m in messages.iter_mut().filter(|m| m.kind == "reply") {
        m.correlation_id = message_id.map(str::to_owned);
    }
    for m in messages.iter().filter(|m| m.kind == "reply") {
        let (Some(session), Ok(body)) = (&m.session, serde_json::from_slice::<Value>(&m.body)) else {
            continue;
        };
        let text = |k: &str| m.headers.get(k).map(crate::broker::HeaderValue::as_text);
        let turn = text("x-aptix-turn-id").filter(|t| t != "-");
        let outcome = text("x-aptix-outcome").unwrap_or_else(|| "refused".into());
        let stored = StoredReply {
            message_id: &m.message_id,
            session,
            turn_id: turn.as_deref(),
            outcome: &outcome,
            body: &body,
        };
        if let Err(e) = deps.store.save_reply(&stored).await {
            return Disposition::Retry { reason: format!("could not store a refusal: {e}") };
        }
    }
    Disposition::Forward { messages, outbox_ids }
}

/// The ingress message can never be handled (retries spent, poison, unusable data): the turn
/// it admitted, if any, fails (record, reply, the session's next turn); otherwise the client
/// is told, if there is one to tell.
pub async fn exhausted(deps: &Deps, body: &[u8], message_id: Option<&str>, reason: &str) -> Vec<OutMessage> {
    let submission = message_fingerprint(message_id, body);
    let tag = format!("exhausted-{submission}");
    tracing::error!(%reason, submission, "giving up an ingress message");
    let error = ApiError::new(
        ErrorCode::RetriesExhausted,
        "the request could not be processed; an operator has the details".to_owned(),
    );
    let (session, turn) = turn_hint(body);
    let Some(session) = session else { return vec![] };
    if let (Some(turn), Ok(request)) = (&turn, validate_bytes(body, &deps.settings.limits)) {
        if let Ok(Some(outbox)) = fail_admitted(deps, &session, turn, &request, error.clone()).await {
            return outbox.messages;
        }
    }
    vec![error_reply(deps, &session, turn.as_deref(), &tag, vec![error])]
}

async fn fail_admitted(
    deps: &Deps,
    session: &SessionId,
    turn: &str,
    request: &ValidatedRequest,
    error: ApiError,
) -> Result<Option<crate::store::PendingOutbox>, StoreError> {
    let Ok(turn_id) = turn.parse() else { return Ok(None) };
    let key = crate::contracts::TurnKey { session_id: *session, turn_id };
    let fail = |row: &TurnRow, _: &str| -> (NewRecord, Vec<OutMessage>) {
        let reply: Reply = InvokeResult::fail(vec![error.clone()]);
        let record = NewRecord {
            kind: "error".into(),
            errors: serde_json::json!([error]),
            reply: serde_json::to_value(&reply).unwrap_or_default(),
            ..NewRecord::default()
        };
        let tag = format!("step-{}", row.step);
        (record, vec![deps.reply(session, Some(turn), &tag, &reply)])
    };
    let fwd = |row: &TurnRow| forward(deps, row);
    deps.store.fail_admitted(&key, &request.fingerprint(), &fail, &fwd).await
}

/// A stable name for one ingress message: the same for each redelivery of it, different for
/// another submission (another message id, or other bytes).
pub fn message_fingerprint(message_id: Option<&str>, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(message_id.unwrap_or_default().as_bytes());
    hash.update([0]);
    hash.update(body);
    hex::encode(&hash.finalize()[..12])
}

fn reject(deps: &Deps, body: &[u8], submission: &str, errors: Vec<ApiError>) -> Disposition {
    match turn_hint(body) {
        (Some(session), turn) => {
            debug!(%session, turn = turn.as_deref().unwrap_or("-"), errors = errors.len(), "request rejected");
            let tag = format!("rejected-{submission}");
            Disposition::forward(vec![error_reply(deps, &session, turn.as_deref(), &tag, errors)])
        }
        // Nobody to answer: keep the message and the reason for an operator.
        (None, _) => {
            let first = errors.first().map_or_else(String::new, ToString::to_string);
            Disposition::DeadLetter { reason: format!("no usable SessionId; {first}"), messages: vec![] }
        }
    }
}

fn error_reply(
    deps: &Deps,
    session: &SessionId,
    turn: Option<&str>,
    tag: &str,
    errors: Vec<ApiError>,
) -> OutMessage {
    let reply: Reply = InvokeResult::fail(errors);
    let mut msg = deps.reply(session, turn, tag, &reply);
    // A refusal creates nothing: the session may not exist, so its queue is bound only if the
    // client declared it.
    msg.create_queue = false;
    msg
}

fn stored_reply(deps: &Deps, session: &SessionId, turn: &str, submission: &str, reply: Value) -> OutMessage {
    // The same reply as the first time, under an id of its own: it answers another submission.
    let tag = format!("resent-{submission}");
    let outcome = ReplyOutcome::of_stored(&reply);
    deps.reply_bytes(session, Some(turn), &tag, outcome, serde_json::to_vec(&reply).unwrap_or_default())
}

/// The message that starts (or resumes) a stored turn.
pub fn forward(deps: &Deps, row: &TurnRow) -> OutMessage {
    let pending: Vec<ToolCall> =
        row.pending_tool_calls.clone().and_then(|p| serde_json::from_value(p).ok()).unwrap_or_default();
    // Built from stored JSON: the next stage re-validates it when it decodes the message.
    let msg = serde_json::json!({
        "Kind": "turn.retrieve/v1",
        "key": { "session_id": row.session_id, "turn_id": row.turn_id },
        "step": row.step,
        "turn": row.request,
        "continuation": row.continuation,
        "pending_tool_calls": pending,
        "admitted_at": Utc::now(),
        "carried_warnings": row.pending_warnings.clone().unwrap_or_else(|| serde_json::json!([])),
    });
    let decoded: Option<StageMessage> = serde_json::from_value(msg.clone()).ok();
    match decoded {
        Some(m) => deps.to_stage(StageName::Retrieve, &m),
        None => OutMessage::to_queue(
            deps.topology.stage_queue(StageName::Retrieve),
            "turn",
            format!("retrieve:{}:{}:{}", row.session_id, row.turn_id, row.step),
            serde_json::to_vec(&msg).unwrap_or_default(),
        ),
    }
}

async fn user_turn(
    deps: &Deps,
    request: &ValidatedRequest,
    turn: &UserTurn,
    submission: &str,
) -> Result<Disposition, StoreError> {
    let key = turn.key();
    let mut context_errors = Vec::new();
    if let Err(e) = deps.conversation_context(turn) {
        context_errors.push(e);
    }
    if let Err(e) = deps.agent_context(turn) {
        context_errors.push(e);
    }
    if !context_errors.is_empty() {
        return Ok(Disposition::forward(vec![error_reply(
            deps,
            &key.session_id,
            Some(key.turn_id.as_str()),
            &format!("rejected-context-{submission}"),
            context_errors,
        )]));
    }
    let meta = SessionMeta {
        agent_context_id: turn.agent_context_id().map(|c| c.to_string()),
        conversation_context_id: turn.conversation_context_id().map(|c| c.to_string()),
        workspace_id: turn.workspace_id().map(str::to_owned),
        repo: turn.repo().map(str::to_owned),
    };
    let wire = serde_json::to_value(request)?;
    let fwd = |row: &TurnRow| forward(deps, row);
    let admission = deps.store.admit_user_turn(key, &request.fingerprint(), &wire, &meta, &fwd).await?;
    let (session, turn_id) = (&key.session_id, key.turn_id.as_str());
    Ok(match admission {
        Admission::Accepted { outbox, queued, new_session } => {
            info!(%session, turn = turn_id, queued, new_session, "turn admitted");
            Disposition::Forward { messages: outbox.messages, outbox_ids: outbox.ids }
        }
        Admission::InFlight { outbox } => {
            info!(%session, turn = turn_id, "duplicate of a turn in flight");
            Disposition::Forward { messages: outbox.messages, outbox_ids: outbox.ids }
        }
        Admission::Finished { reply } => {
            Disposition::forward(vec![stored_reply(deps, session, turn_id, submission, reply)])
        }
        Admission::Conflict => Disposition::forward(vec![error_reply(
            deps,
            session,
            Some(turn_id),
            &format!("conflict-{submission}"),
            vec![ApiError::at(
                ErrorCode::TurnConflict,
                "TurnId",
                format!("TurnId `{turn_id}` was already used in this session with different content"),
            )],
        )]),
        Admission::AwaitingToolResults { turn_id: waiting } => {
            let error = ApiError::new(
                ErrorCode::SessionAwaitingToolResults,
                format!("the session waits for the tool results of turn `{waiting}`; submit them before a new turn"),
            );
            Disposition::forward(vec![error_reply(
                deps,
                session,
                Some(turn_id),
                &format!("rejected-awaiting-{submission}"),
                vec![error],
            )])
        }
    })
}

async fn continuation(
    deps: &Deps,
    request: &ValidatedRequest,
    c: &ToolContinuation,
    submission: &str,
) -> Result<Disposition, StoreError> {
    let key = c.key();
    let wire = serde_json::to_value(request)?;
    let check = |row: &TurnRow| -> Result<(), String> {
        let pending: Vec<ToolCall> =
            row.pending_tool_calls.clone().and_then(|p| serde_json::from_value(p).ok()).unwrap_or_default();
        check_tool_results(&pending, c).map_err(|m| m.to_api_error().message)
    };
    let abort = |row: &TurnRow, reason: &str| -> (NewRecord, Vec<OutMessage>) {
        let error = ApiError::at(ErrorCode::ToolResultsMismatch, "ToolResults", reason.to_owned());
        let reply: Reply = InvokeResult::fail(vec![error.clone()]);
        let record = NewRecord {
            kind: "error".into(),
            errors: serde_json::json!([error]),
            reply: serde_json::to_value(&reply).unwrap_or_default(),
            request_payload: Some(wire.clone()),
            ..NewRecord::default()
        };
        (
            record,
            vec![deps.reply(
                &key.session_id,
                Some(key.turn_id.as_str()),
                &format!("step-{}", row.step),
                &reply,
            )],
        )
    };
    let fwd = |row: &TurnRow| forward(deps, row);
    let admission =
        deps.store.admit_continuation(key, &request.fingerprint(), &wire, &check, &abort, &fwd).await?;
    let (session, turn_id) = (&key.session_id, key.turn_id.as_str());
    let reject = |code: ErrorCode, message: String| {
        Disposition::forward(vec![error_reply(
            deps,
            session,
            Some(turn_id),
            &format!("rejected-continuation-{submission}"),
            vec![ApiError::at(code, "TurnId", message)],
        )])
    };
    Ok(match admission {
        ContinuationAdmission::Accepted { outbox }
        | ContinuationAdmission::InFlight { outbox }
        | ContinuationAdmission::Aborted { outbox } => {
            Disposition::Forward { messages: outbox.messages, outbox_ids: outbox.ids }
        }
        ContinuationAdmission::Finished { reply } => {
            Disposition::forward(vec![stored_reply(deps, session, turn_id, submission, reply)])
        }
        ContinuationAdmission::NotFound => {
            reject(ErrorCode::TurnNotFound, format!("no turn `{turn_id}` in this session"))
        }
        ContinuationAdmission::NotAwaiting { state } => reject(
            ErrorCode::TurnNotAwaitingToolResults,
            format!("turn `{turn_id}` is {state}, not waiting for tool results"),
        ),
    })
}
