//! Validation of AGN-034 requests: raw bytes in, a [`ValidatedRequest`] or a list of specific
//! errors out. Only rules that need no stored state live here; session and turn rules belong to
//! the validate stage.
//!
//! The work is bounded before anything is built: the size first, then one scan that refuses
//! lists over their limits without building their elements (`scan`), then the typed read of the
//! known properties, then the rules. Error lists are capped at `limits.max_errors` (`errors`).

mod approvals;
mod attachments;
mod cancel;
mod checks;
mod continuation;
mod errors;
mod hint;
mod parse;
mod scan;
mod skim;
mod text;

use std::fmt;

use serde::Deserialize as _;

use crate::contracts::{AgentExecuteRequest, ApiError, ValidatedRequest};

pub use crate::config::Limits;
pub use cancel::{
    cancel_bytes, resume_bytes, Resume, CANCEL_TYPE, MAX_CONTROL_BYTES, RESUME_TYPE, SERVER_TYPES,
};
pub use hint::{session_hint, turn_hint};
pub use parse::parse_bytes;

/// One or more validation failures, in the order they were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ApiError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}

/// Validates a message body: size, parsing, field names and types, then every AGN-034 rule.
pub fn validate_bytes(bytes: &[u8], limits: &Limits) -> Result<ValidatedRequest, ValidationErrors> {
    let mut e = errors::Errors::new(limits.max_errors);
    let Some(wire) = parse::read(bytes, limits, &mut e) else {
        return Err(e.finish());
    };
    checks::check(wire, limits, &mut e).filter(|_| e.is_empty()).ok_or_else(|| e.finish())
}

/// A request read back from PostgreSQL, checked again at that boundary (the structural rules:
/// a row edited by hand or written by another version must not reach a stage unchecked).
pub fn from_stored(value: &serde_json::Value) -> Result<ValidatedRequest, StoredRequestError> {
    crate::metrics::metrics().json("parse", "request_stored");
    let wire = AgentExecuteRequest::deserialize(value)?;
    Ok(validate_wire(wire, &Limits::structural_only())?)
}

/// A stored request that is no longer a valid one.
#[derive(Debug, thiserror::Error)]
pub enum StoredRequestError {
    /// Not a request's shape.
    #[error(transparent)]
    Shape(#[from] serde_json::Error),
    /// It breaks the rules.
    #[error(transparent)]
    Rules(#[from] ValidationErrors),
}

/// Applies the AGN-034 rules to an already-parsed request.
pub fn validate_wire(
    wire: AgentExecuteRequest,
    limits: &Limits,
) -> Result<ValidatedRequest, ValidationErrors> {
    let mut e = errors::Errors::new(limits.max_errors);
    checks::check(wire, limits, &mut e).filter(|_| e.is_empty()).ok_or_else(|| e.finish())
}
