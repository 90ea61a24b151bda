//! Bytes to the wire request: size, UTF-8, then one bounded scan (syntax, kind, property names,
//! list lengths) before the typed read of the known properties.

use serde::de::value::MapDeserializer;

use super::errors::Errors;
use super::scan::{known_fields, scan};
use super::{checks, Limits, ValidationErrors};
use crate::contracts::ids::clip;
use crate::contracts::{AgentExecuteRequest, ApiError, ErrorCode};

/// Parses a message body into the wire request, reporting every unknown or forbidden top-level
/// property by name (with the request's other problems, when there are any).
pub fn parse_bytes(bytes: &[u8], limits: &Limits) -> Result<AgentExecuteRequest, ValidationErrors> {
    let mut e = Errors::new(limits.max_errors);
    match read(bytes, limits, &mut e) {
        Some(wire) if e.is_empty() => Ok(wire),
        Some(wire) => {
            // Names were wrong: the rules still run on the rest, so every problem is reported.
            let _ = checks::check(wire, limits, &mut e);
            Err(e.finish())
        }
        None => Err(e.finish()),
    }
}

/// The wire request, or `None` when it cannot be read (the reasons are in `e`). A request read
/// despite unknown or forbidden properties is returned with those errors already in `e`.
pub(super) fn read(bytes: &[u8], limits: &Limits, e: &mut Errors) -> Option<AgentExecuteRequest> {
    // The size first: nothing is read from a body over the limit.
    if bytes.len() > limits.max_request_bytes {
        e.push(ApiError::new(
            ErrorCode::RequestTooLarge,
            format!(
                "the request is {} bytes; the limit (limits.max_request_bytes) is {}",
                bytes.len(),
                limits.max_request_bytes
            ),
        ));
        return None;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(err) => {
            e.push(ApiError::new(
                ErrorCode::RequestInvalidUtf8,
                format!(
                    "the request is not valid UTF-8 (first bad byte at offset {})",
                    err.valid_up_to()
                ),
            ));
            return None;
        }
    };
    let m = crate::metrics::metrics();
    m.json("parse", "request_scan");
    let scanned = match scan(text, limits, e) {
        Ok(s) => s,
        Err(err) => {
            // Errors the scan recorded before it hit bad syntax are about a broken document.
            *e = Errors::new(limits.max_errors);
            e.push(ApiError::new(ErrorCode::RequestInvalidJson, json_problem(&err)));
            return None;
        }
    };
    if let Some(kind) = scanned.not_object {
        e.push(ApiError::new(
            ErrorCode::RequestNotObject,
            format!("the request must be a JSON object, not {kind}"),
        ));
        return None;
    }
    if scanned.over_limit {
        // Refused before anything is built per element: the errors name the lists.
        return None;
    }
    m.json("parse", "request_fields");
    let fields = match known_fields(text) {
        Ok(f) => f,
        Err(err) => {
            e.push(ApiError::new(ErrorCode::RequestInvalidJson, json_problem(&err)));
            return None;
        }
    };
    m.json("parse", "request_read");
    let map = MapDeserializer::<_, serde_json::Error>::new(fields.into_iter());
    match serde_path_to_error::deserialize::<_, AgentExecuteRequest>(map) {
        Ok(wire) => Some(wire),
        Err(err) => {
            e.push(type_error(&err));
            None
        }
    }
}

fn type_error(e: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let inner = e.inner();
    let path = e.path().to_string();
    let message = strip_position(&inner.to_string());
    if !inner.is_data() {
        return ApiError::new(ErrorCode::RequestInvalidJson, json_problem(inner));
    }
    if let Some(name) = backticked(&message, "unknown field `") {
        // The path already ends with the unknown property's name.
        let field = if path == "." { name.clone() } else { path.clone() };
        let parent =
            field.strip_suffix(name.as_str()).map(|p| p.trim_end_matches('.')).unwrap_or("");
        let owner =
            if parent.is_empty() { "the request".to_owned() } else { format!("`{parent}`") };
        return ApiError::at(
            ErrorCode::RequestUnknownField,
            clip(&field),
            format!("`{}` is not a property of {owner}", clip(&name)),
        );
    }
    if let Some(name) = backticked(&message, "duplicate field `") {
        return ApiError::at(
            ErrorCode::RequestInvalidJson,
            clip(&name),
            format!("property `{}` appears more than once", clip(&name)),
        );
    }
    ApiError::at(ErrorCode::RequestInvalidType, path.clone(), format!("{path}: {message}"))
}

fn json_problem(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Eof => "the JSON ends early (truncated?)".to_owned(),
        _ => strip_position(&e.to_string()),
    };
    format!("invalid JSON at line {} column {}: {what}", e.line(), e.column())
}

fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

fn backticked(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    rest.find('`').map(|end| rest[..end].to_owned())
}
