//! What admission answers with besides admitted turns: refusals and their errors, and the
//! stored forms of a request (its wire JSON, its fingerprint, its session's name).

use tracing::debug;

use crate::contracts::{ApiError, ErrorCode, SessionId, ValidatedRequest};
use crate::messages::{AdmittedTurn, Outgoing, ReplyOut};
use crate::rules::turn_hint;
use crate::stage::{Cause, Output, StageError};
use crate::store::Limit;

/// A redelivered submission (its consumer stopped before acknowledging it) whose turn already
/// finished is answered by that turn's own step replies: the stored reply is not sent again
/// under a new id, which the client could not tell from a second answer. A client's own resend
/// arrives as a new delivery and still gets the stored reply.
pub(super) fn without_resent(mut output: Output<AdmittedTurn>) -> Output<AdmittedTurn> {
    if let Output::Publish(messages) = &mut output {
        messages.retain(|m| !matches!(m, Outgoing::Reply(r) if r.is_resent()));
    }
    output
}

/// An invalid submission: refused to its session, or dead-lettered when it names none.
pub(super) fn reject(
    body: &[u8],
    submission: &str,
    errors: Vec<ApiError>,
) -> Result<Output<AdmittedTurn>, StageError> {
    match turn_hint(body) {
        (Some(session), turn) => {
            debug!(%session, turn = turn.as_deref().unwrap_or("-"), errors = errors.len(), "request rejected");
            let tag = format!("rejected-{submission}");
            Ok(Output::Publish(vec![refusal(session, turn.as_deref(), tag, errors)]))
        }
        // Nobody to answer: keep the message and the reason for an operator.
        (None, _) => {
            let first = errors.first().map_or_else(String::new, ToString::to_string);
            Err(StageError::Refused(Cause::NoSession(first)))
        }
    }
}

/// The request as stored (wire JSON).
pub(super) fn stored_form(request: &ValidatedRequest) -> Result<serde_json::Value, StageError> {
    crate::metrics::metrics().json("serialize", "request_stored");
    Ok(serde_json::to_value(request)?)
}

/// The request's fingerprint, as the client sent it (a duplicate compares with this).
pub(super) fn fingerprint(request: &ValidatedRequest) -> String {
    crate::metrics::metrics().json("serialize", "request_fingerprint");
    request.fingerprint()
}

/// A session's name from its first instruction: the first non-empty line, trimmed, at most 80
/// characters (Session Architecture §2.3).
pub fn session_name(instruction: &str) -> Option<String> {
    let line = instruction.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().filter(|c| !c.is_control()).take(80).collect())
}

/// The answer to a turn for another tenant's session.
pub(super) fn unavailable() -> ApiError {
    ApiError::at(
        ErrorCode::SessionUnavailable,
        "SessionId",
        "this SessionId cannot be used by this publisher; start a session with a new SessionId",
    )
}

/// The answer to a turn over its tenant's limit.
pub(super) fn over_limit(limit: Limit) -> ApiError {
    let (code, message) = match limit {
        Limit::TurnsInFlight(n) => (
            ErrorCode::LimitTurnsInFlight,
            format!("this tenant may have {n} turns in flight; try again when one ends"),
        ),
        Limit::TurnsPerMinute(n) => (
            ErrorCode::LimitTurnsPerMinute,
            format!("this tenant may start {n} turns per minute; try again later"),
        ),
        Limit::SessionsPerMinute(n) => (
            ErrorCode::LimitSessionsPerMinute,
            format!("this tenant may create {n} sessions per minute; try again later"),
        ),
        Limit::TokensPerMinute(n) => (
            ErrorCode::LimitTokensPerMinute,
            format!("this tenant's turns may use {n} LLM tokens per minute; try again later"),
        ),
        Limit::Budget(period, budget) => (
            ErrorCode::LimitBudgetExhausted,
            format!(
                "this tenant's budget of {budget} per {} is spent; try again in the next {}",
                period.as_str(),
                period.as_str()
            ),
        ),
    };
    ApiError::new(code, message)
}

pub(super) fn refusal(
    session: SessionId,
    turn: Option<&str>,
    tag: String,
    errors: Vec<ApiError>,
) -> Outgoing {
    Outgoing::Reply(ReplyOut::refusal(session, turn, tag, errors))
}
