//! The body of a cancel (`type` = `turn.cancel`): `{"SessionId": "…", "TurnId": "…"}` and
//! nothing else. Bounded like a request: the size first, then one parse of a small object.

use serde_json::{Map, Value};

use super::{Limits, ValidationErrors};
use crate::contracts::{ApiError, ErrorCode, TurnKey};

/// The AMQP `type` that marks a message on the request entry point as a cancel.
pub const CANCEL_TYPE: &str = "turn.cancel";

/// Reads a cancel body into the turn it names, or every reason it names none.
pub fn cancel_bytes(bytes: &[u8], limits: &Limits) -> Result<TurnKey, ValidationErrors> {
    let fail = |code, message: String| Err(ValidationErrors(vec![ApiError::new(code, message)]));
    if bytes.len() > limits.max_request_bytes {
        let max = limits.max_request_bytes;
        return fail(
            ErrorCode::RequestTooLarge,
            format!("the cancel is {} bytes; the limit is {max}", bytes.len()),
        );
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return fail(ErrorCode::RequestInvalidUtf8, "the cancel is not valid UTF-8".into());
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return fail(ErrorCode::RequestInvalidJson, format!("the cancel is not JSON: {e}"))
        }
    };
    let Value::Object(fields) = value else {
        return fail(ErrorCode::RequestNotObject, "the cancel is not a JSON object".into());
    };
    key_of(&fields).map_err(ValidationErrors)
}

fn key_of(fields: &Map<String, Value>) -> Result<TurnKey, Vec<ApiError>> {
    let mut errors: Vec<ApiError> = fields
        .keys()
        .filter(|k| !matches!(k.as_str(), "SessionId" | "TurnId"))
        .take(8)
        .map(|k| {
            let shown: String = k.chars().take(64).collect();
            ApiError::at(
                ErrorCode::RequestUnknownField,
                &shown,
                format!("`{shown}` is not a field of a cancel (only `SessionId` and `TurnId`)"),
            )
        })
        .collect();
    let text = |name: &str, missing: ErrorCode| match fields.get(name) {
        None | Some(Value::Null) => Err(ApiError::at(missing, name, format!("{name} is required"))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ApiError::at(
            ErrorCode::RequestInvalidType,
            name,
            format!("{name} must be a string"),
        )),
    };
    let session = text("SessionId", ErrorCode::SessionIdMissing)
        .and_then(|s| s.parse().map_err(|(c, m)| ApiError::at(c, "SessionId", m)));
    let turn = text("TurnId", ErrorCode::TurnIdMissing)
        .and_then(|t| t.parse().map_err(|(c, m)| ApiError::at(c, "TurnId", m)));
    match (session, turn) {
        (Ok(session_id), Ok(turn_id)) if errors.is_empty() => Ok(TurnKey { session_id, turn_id }),
        (s, t) => {
            errors.extend(s.err());
            errors.extend(t.err());
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    fn codes(body: &str) -> Vec<&'static str> {
        match cancel_bytes(body.as_bytes(), &limits()) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(|e| e.code.as_str()).collect(),
        }
    }

    #[test]
    fn a_cancel_names_one_turn() {
        let body = r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t-1"}"#;
        let key = cancel_bytes(body.as_bytes(), &limits()).unwrap();
        assert_eq!(key.turn_id.as_str(), "t-1");
        assert_eq!(key.session_id.to_string(), "0b3f7c9e-1111-4222-8333-444455556666");
    }

    #[test]
    fn each_bad_cancel_gets_its_specific_code() {
        assert_eq!(codes("{"), ["request.invalid_json"]);
        assert_eq!(codes("[1]"), ["request.not_object"]);
        assert_eq!(codes("{}"), ["validation.session_id_missing", "validation.turn_id_missing"]);
        assert_eq!(
            codes(r#"{"SessionId":"x","TurnId":5,"Instruction":"hi"}"#),
            ["request.unknown_field", "validation.session_id_invalid", "request.invalid_type"]
        );
        let big = format!(r#"{{"SessionId":"{}"}}"#, "a".repeat(limits().max_request_bytes));
        assert_eq!(codes(&big), ["request.too_large"]);
        assert_eq!(
            cancel_bytes(&[0xff, 0xfe], &limits()).unwrap_err().0[0].code.as_str(),
            "request.invalid_utf8"
        );
    }
}
