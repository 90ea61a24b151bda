//! Bytes to the wire request: size, UTF-8, JSON syntax, property names and JSON types.

use serde_json::Value;

use super::{Limits, ValidationErrors};
use crate::contracts::request::{FORBIDDEN_FIELDS, REQUEST_FIELDS};
use crate::contracts::{AgentExecuteRequest, ApiError, ErrorCode, SessionId};

/// Parses a message body into the wire request, reporting every unknown or forbidden top-level
/// property by name.
pub fn parse_bytes(bytes: &[u8], limits: &Limits) -> Result<AgentExecuteRequest, ValidationErrors> {
    let fail = |e: ApiError| Err(ValidationErrors(vec![e]));
    if bytes.len() > limits.max_request_bytes {
        return fail(ApiError::new(
            ErrorCode::RequestTooLarge,
            format!(
                "the request is {} bytes; the limit (limits.max_request_bytes) is {}",
                bytes.len(),
                limits.max_request_bytes
            ),
        ));
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return fail(ApiError::new(
                ErrorCode::RequestInvalidUtf8,
                format!("the request is not valid UTF-8 (first bad byte at offset {})", e.valid_up_to()),
            ))
        }
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return fail(ApiError::new(ErrorCode::RequestInvalidJson, json_problem(&e))),
    };
    let Value::Object(map) = &value else {
        return fail(ApiError::new(
            ErrorCode::RequestNotObject,
            format!("the request must be a JSON object, not {}", kind_of(&value)),
        ));
    };
    let name_errors: Vec<ApiError> = map.keys().filter_map(|k| field_name_error(k)).collect();
    if name_errors.is_empty() {
        // Deserialize from the text, not the Value: only the text still shows duplicate properties.
        let mut de = serde_json::Deserializer::from_str(text);
        return serde_path_to_error::deserialize(&mut de).map_err(|e| ValidationErrors(vec![type_error(&e)]));
    }
    // Drop the offending properties and read the rest, so their problems are reported too.
    let mut rest = map.clone();
    rest.retain(|k, _| REQUEST_FIELDS.contains(&k.as_str()));
    let mut errors = name_errors;
    match serde_path_to_error::deserialize::<_, AgentExecuteRequest>(Value::Object(rest)) {
        Ok(wire) => {
            if let Err(more) = super::validate_wire(wire, limits) {
                errors.extend(more.0);
            }
        }
        Err(e) => errors.push(type_error(&e)),
    }
    Err(ValidationErrors(errors))
}

/// The `(SessionId, TurnId)` a possibly invalid body names, as far as they can be read.
pub fn turn_hint(bytes: &[u8]) -> (Option<SessionId>, Option<String>) {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) else {
        return (None, None);
    };
    let session = map.get("SessionId").and_then(Value::as_str).and_then(|s| s.parse().ok());
    let turn = map
        .get("TurnId")
        .and_then(Value::as_str)
        .filter(|t| t.parse::<crate::contracts::TurnId>().is_ok())
        .map(str::to_owned);
    (session, turn)
}

fn field_name_error(key: &str) -> Option<ApiError> {
    if REQUEST_FIELDS.contains(&key) {
        return None;
    }
    if FORBIDDEN_FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key)) {
        return Some(ApiError::at(
            ErrorCode::RequestForbiddenField,
            key,
            format!("`{key}` is server-owned and must not appear in a request (AGN-034 §3)"),
        ));
    }
    let hint = REQUEST_FIELDS
        .iter()
        .find(|f| f.eq_ignore_ascii_case(key))
        .map(|f| format!("; property names are PascalCase: did you mean `{f}`?"))
        .unwrap_or_default();
    Some(ApiError::at(
        ErrorCode::RequestUnknownField,
        key,
        format!("`{}` is not an AgentExecuteRequest property{hint}", crate::contracts::ids::clip(key)),
    ))
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
        let parent = field.strip_suffix(name.as_str()).map(|p| p.trim_end_matches('.')).unwrap_or("");
        let owner = if parent.is_empty() { "the request".to_owned() } else { format!("`{parent}`") };
        return ApiError::at(
            ErrorCode::RequestUnknownField,
            field.clone(),
            format!("`{name}` is not a property of {owner}"),
        );
    }
    if let Some(name) = backticked(&message, "duplicate field `") {
        return ApiError::at(
            ErrorCode::RequestInvalidJson,
            name.clone(),
            format!("property `{name}` appears more than once"),
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

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
