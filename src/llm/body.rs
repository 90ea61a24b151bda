//! The `/responses` body as it travels: serialised once where assemble builds it, then carried
//! in the stage messages, sent to the provider and stored in the record byte for byte. No stage
//! after assemble rebuilds its tree: the body is the largest part of a turn (26 KB of the
//! 30 KB invoke message with this repository as the corpus), and parsing it into a
//! `serde_json::Value` and writing it out again at every hop was a fifth of the JSON work.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// A `/responses` request body: valid JSON, kept as its text.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestBody(Box<RawValue>);

/// The few top-level fields read from a body without building its tree.
#[derive(Debug, Default, Deserialize)]
pub struct BodyHead {
    /// `model`.
    #[serde(default)]
    pub model: Option<String>,
    /// `stream`: `true` selects SSE.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `max_output_tokens`.
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    /// `previous_response_id`: the provider adds that chain's tokens to the input.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// `temperature`.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// `top_p`.
    #[serde(default)]
    pub top_p: Option<f64>,
}

impl RequestBody {
    /// `value`'s JSON text.
    pub fn new(value: &Value) -> Self {
        // A `Value` always serialises: its keys are strings and it holds no NaN.
        let raw = serde_json::value::to_raw_value(value).unwrap_or_else(|_| Self::null().0);
        RequestBody(raw)
    }

    /// `null`: a body left out (a saved answer stores none; the invoke message carries it).
    pub fn null() -> Self {
        RequestBody(RawValue::NULL.to_owned())
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        self.0.get() == "null"
    }

    /// Whether the body is a JSON object, as `/responses` requires.
    pub fn is_object(&self) -> bool {
        self.0.get().starts_with('{')
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The JSON text, for storing with sqlx as `jsonb`.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// Its top-level `model`, `stream` and limits (a scan of the text; nothing else is kept).
    pub fn head(&self) -> BodyHead {
        serde_json::from_str(self.0.get()).unwrap_or_default()
    }

    /// The whole tree: for tests and the rare paths that edit or inspect a body.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl Default for RequestBody {
    fn default() -> Self {
        Self::null()
    }
}

impl PartialEq for RequestBody {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestBody({} bytes)", self.0.get().len())
    }
}

impl From<Value> for RequestBody {
    fn from(value: Value) -> Self {
        RequestBody::new(&value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_travels_as_the_text_it_was_built_as() {
        let value = json!({"model": "gpt-5.1", "stream": true, "input": [{"role": "user"}]});
        let body = RequestBody::new(&value);
        let message = serde_json::to_string(&json!({"assembled": {"body": &body}})).unwrap();
        assert_eq!(message, format!("{{\"assembled\":{{\"body\":{}}}}}", value));
        #[derive(Deserialize)]
        struct Carrier {
            body: RequestBody,
        }
        let back: Carrier = serde_json::from_str(&format!("{{\"body\": {message}}}")).unwrap();
        assert_eq!(back.body.to_value(), json!({"assembled": {"body": value}}));
        let from_tree: Carrier = serde_json::from_value(json!({"body": value.clone()})).unwrap();
        assert_eq!(from_tree.body, body, "a body read from a stored tree is the same text");
    }

    #[test]
    fn the_head_is_read_without_the_rest() {
        let body = RequestBody::new(&json!({"model": "m", "stream": true, "top_p": 0.5,
            "input": [{"content": "x".repeat(100)}]}));
        let head = body.head();
        assert_eq!(
            (head.model.as_deref(), head.stream, head.top_p),
            (Some("m"), Some(true), Some(0.5))
        );
        assert!(body.is_object() && !body.is_null());
        assert!(RequestBody::null().is_null() && !RequestBody::null().is_object());
        assert_eq!(RequestBody::new(&json!([1])).head().model, None);
    }
}
