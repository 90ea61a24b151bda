//! The bodies of a cancel (`type` = `turn.cancel`: `{"SessionId": "…", "TurnId": "…"}`) and of
//! a resume (`type` = `turn.resume`: the same and an optional `AfterSeq`), and nothing else.
//! Bounded before they are parsed: at most [`MAX_CONTROL_BYTES`], then one parse of a small
//! object. A JSON tree takes tens of times its text's bytes (an array of zeros, forty), so the
//! request limit (megabytes) would let one cancel hold hundreds of megabytes of validate.

use serde_json::{Map, Value};

use super::{Limits, ValidationErrors};
use crate::contracts::{ApiError, ErrorCode, TurnKey};

/// The AMQP `type` that marks a message on the request entry point as a cancel.
pub const CANCEL_TYPE: &str = "turn.cancel";

/// The AMQP `type` that marks a message on the request entry point as a resume (§9a).
pub const RESUME_TYPE: &str = "turn.resume";

/// The AMQP `type`s of what the server sends (replies, deltas, the notice that ends a resume,
/// dead letters). On the entry point they are the pipeline's own messages come back (a client's
/// reply queue may dead-letter into it), never a submission: answering one would send it round
/// again.
pub const SERVER_TYPES: [&str; 4] = ["reply", "delta", "resumed", "dead"];

/// The largest cancel or resume body, bytes: its fields are two ids and a number (under 200
/// bytes), so this leaves room for whitespace and nothing else.
pub const MAX_CONTROL_BYTES: usize = 4096;

/// A resume: the turn, and the `x-aptix-event-seq` after which its events are wanted (all of
/// them when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The turn.
    pub key: TurnKey,
    /// The last event the client has.
    pub after: Option<i64>,
}

/// Reads a cancel body into the turn it names, or every reason it names none.
pub fn cancel_bytes(bytes: &[u8], limits: &Limits) -> Result<TurnKey, ValidationErrors> {
    let fields = object_of(bytes, limits, "cancel")?;
    key_of(&fields, "cancel", &[]).map_err(ValidationErrors)
}

/// Reads a resume body, or every reason it is not one.
pub fn resume_bytes(bytes: &[u8], limits: &Limits) -> Result<Resume, ValidationErrors> {
    let fields = object_of(bytes, limits, "resume")?;
    let after = match fields.get("AfterSeq") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().and_then(|n| i64::try_from(n).ok()).map(Some).ok_or_else(|| {
            ApiError::at(
                ErrorCode::RequestInvalidType,
                "AfterSeq",
                "AfterSeq must be an integer from 0 (an x-aptix-event-seq you received)",
            )
        }),
    };
    match (key_of(&fields, "resume", &["AfterSeq"]), after) {
        (Ok(key), Ok(after)) => Ok(Resume { key, after }),
        (k, a) => Err(ValidationErrors(k.err().into_iter().flatten().chain(a.err()).collect())),
    }
}

fn object_of(
    bytes: &[u8],
    limits: &Limits,
    what: &str,
) -> Result<Map<String, Value>, ValidationErrors> {
    let fail = |code, message: String| Err(ValidationErrors(vec![ApiError::new(code, message)]));
    let max = MAX_CONTROL_BYTES.min(limits.max_request_bytes);
    if bytes.len() > max {
        return fail(
            ErrorCode::RequestTooLarge,
            format!("the {what} is {} bytes; the limit is {max}", bytes.len()),
        );
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return fail(ErrorCode::RequestInvalidUtf8, format!("the {what} is not valid UTF-8"));
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return fail(ErrorCode::RequestInvalidJson, format!("the {what} is not JSON: {e}"))
        }
    };
    let Value::Object(fields) = value else {
        return fail(ErrorCode::RequestNotObject, format!("the {what} is not a JSON object"));
    };
    Ok(fields)
}

fn key_of(
    fields: &Map<String, Value>,
    what: &str,
    more: &[&str],
) -> Result<TurnKey, Vec<ApiError>> {
    let known = |k: &str| matches!(k, "SessionId" | "TurnId") || more.contains(&k);
    let mut errors: Vec<ApiError> = fields
        .keys()
        .filter(|k| !known(k))
        .take(8)
        .map(|k| {
            let shown: String = k.chars().take(64).collect();
            let also: String = more.iter().map(|m| format!(", `{m}`")).collect();
            ApiError::at(
                ErrorCode::RequestUnknownField,
                &shown,
                format!("`{shown}` is not a field of a {what} (only `SessionId`, `TurnId`{also})"),
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
    fn a_resume_names_a_turn_and_maybe_a_cursor() {
        let body = r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t-1"}"#;
        assert_eq!(resume_bytes(body.as_bytes(), &limits()).unwrap().after, None);
        let body = r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t-1","AfterSeq":1000003}"#;
        assert_eq!(resume_bytes(body.as_bytes(), &limits()).unwrap().after, Some(1_000_003));
        let codes = |b: &str| -> Vec<&'static str> {
            resume_bytes(b.as_bytes(), &limits())
                .unwrap_err()
                .0
                .iter()
                .map(|e| e.code.as_str())
                .collect()
        };
        assert_eq!(
            codes(
                r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t","AfterSeq":-1}"#
            ),
            ["request.invalid_type"]
        );
        assert_eq!(codes(r#"{"TurnId":"t","AfterSeq":"3","X":1}"#).len(), 3);
        // A cancel takes no cursor.
        let cancel =
            r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t","AfterSeq":3}"#;
        assert!(cancel_bytes(cancel.as_bytes(), &limits()).is_err());
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
        // Far below the request limit: a cancel is never parsed into a tree of megabytes.
        let padded = |n| {
            let body = r#"{"SessionId":"0b3f7c9e-1111-4222-8333-444455556666","TurnId":"t-1"}"#;
            format!("{body}{}", " ".repeat(n - body.len()))
        };
        assert_eq!(codes(&padded(MAX_CONTROL_BYTES)), Vec::<&str>::new());
        assert_eq!(codes(&padded(MAX_CONTROL_BYTES + 1)), ["request.too_large"]);
        let zeros = format!(r#"{{"SessionId":"x","TurnId":"t","x":[{}0]}}"#, "0,".repeat(1 << 20));
        assert_eq!(codes(&zeros), ["request.too_large"]);
        assert_eq!(
            resume_bytes(zeros.as_bytes(), &limits()).unwrap_err().0[0].code.as_str(),
            "request.too_large"
        );
        assert_eq!(
            cancel_bytes(&[0xff, 0xfe], &limits()).unwrap_err().0[0].code.as_str(),
            "request.invalid_utf8"
        );
    }
}
