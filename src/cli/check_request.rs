//! `aptix validate`: the ingress rules, offline.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use crate::contracts::{ApiError, ErrorCode, InvokeResult, ValidatedRequest};
use crate::rules::{validate_bytes, Limits};

/// What a valid request is, as printed in `Result`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ValidationReport {
    /// `user_turn` or `tool_continuation`.
    pub scenario: &'static str,
    /// The session.
    pub session_id: String,
    /// The turn.
    pub turn_id: String,
    /// SHA-256 of the canonical request, used to tell a duplicate from a conflict.
    pub fingerprint: String,
}

/// Validates `path` and prints the `InvokeResult`; exit 0 valid, 1 invalid, 2 unreadable.
pub fn run(path: &Path, limits: &Limits) -> ExitCode {
    let bytes = match super::read_input(path) {
        Ok(b) => b,
        Err(e) => {
            let err =
                ApiError::new(ErrorCode::Internal, format!("cannot read {}: {e}", path.display()));
            print_json(&InvokeResult::<ValidationReport>::fail(vec![err]));
            return ExitCode::from(2);
        }
    };
    match validate_bytes(&bytes, limits) {
        Ok(request) => {
            print_json(&InvokeResult::ok(report(&request)));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            print_json(&InvokeResult::<ValidationReport>::fail(errors.0));
            ExitCode::from(1)
        }
    }
}

/// Summarises a valid request.
pub fn report(request: &ValidatedRequest) -> ValidationReport {
    let key = request.key();
    ValidationReport {
        scenario: match request {
            ValidatedRequest::UserTurn(_) => "user_turn",
            ValidatedRequest::ToolContinuation(_) => "tool_continuation",
        },
        session_id: key.session_id.to_string(),
        turn_id: key.turn_id.to_string(),
        fingerprint: request.fingerprint(),
    }
}

fn print_json<T: Serialize>(value: &T) {
    use std::io::Write as _;
    match serde_json::to_string_pretty(value) {
        // A closed pipe (`| head`) is not worth a panic.
        Ok(text) => {
            let _ = writeln!(std::io::stdout().lock(), "{text}");
        }
        Err(e) => eprintln!("cannot render the result: {e}"),
    }
}
