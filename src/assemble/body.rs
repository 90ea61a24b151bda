//! The `/responses` request envelope (AGN-003 as corrected by DESIGN.md §5): `model`,
//! `previous_response_id` when continuing, `input`, and on every call the context's `tools`,
//! `tool_choice` and `temperature` (the live API does not carry them along a chain), `store:
//! true` (chaining needs stored responses) and `stream`.

use serde_json::{json, Map, Number, Value};

use crate::config::ConversationContext;

/// Builds the request body. Fields are inserted in a fixed order so bodies are stable for
/// golden files and logs.
pub(crate) fn envelope(
    context: &ConversationContext,
    previous_response_id: Option<&str>,
    input: Vec<Value>,
    stream: bool,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(context.model));
    if let Some(id) = previous_response_id {
        body.insert("previous_response_id".into(), json!(id));
    }
    body.insert("input".into(), Value::Array(input));
    if !context.tools.is_empty() {
        let tools = context.tools.iter().map(|t| t.to_responses_json()).collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(name) = &context.tool_choice {
        body.insert("tool_choice".into(), json!({ "type": "function", "name": name }));
    }
    if let Some(t) = context.temperature.and_then(temperature) {
        body.insert("temperature".into(), t);
    }
    body.insert("store".into(), json!(true));
    body.insert("stream".into(), json!(stream));
    Value::Object(body)
}

/// The temperature as the decimal written in the configuration: widening the `f32` directly
/// would send `0.20000000298023224` for `0.2`.
fn temperature(t: f32) -> Option<Value> {
    t.to_string().parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_keeps_its_decimal_spelling() {
        assert_eq!(temperature(0.2), Some(json!(0.2)));
        assert_eq!(temperature(f32::NAN), None);
    }
}
