//! The `/responses` request envelope (AGN-003 as corrected by DESIGN.md §5): `model`,
//! `previous_response_id` when continuing, `input`, and on every call the context's `tools`,
//! `tool_choice` and `temperature` (the live API does not carry them along a chain), `store:
//! true` (chaining needs stored responses) and `stream`.

use serde_json::{json, Map, Number, Value};

use crate::config::ConversationContext;

/// Whether a configured `tool_choice` is enforced on this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// A user turn: the context's forced tool applies.
    Enforce,
    /// A tool continuation: `"auto"`, so the model can answer once it has the results instead
    /// of being forced to call the same tool again forever.
    Relax,
}

/// Builds the request body. Fields are inserted in a fixed order so bodies are stable for
/// golden files and logs.
pub(crate) fn envelope(
    context: &ConversationContext,
    previous_response_id: Option<&str>,
    input: Vec<Value>,
    stream: bool,
    choice: ToolChoice,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(context.model));
    if let Some(id) = previous_response_id {
        body.insert("previous_response_id".into(), json!(id));
    }
    body.insert("input".into(), Value::Array(input));
    let client = context.tools.iter().map(|t| t.to_responses_json());
    let server = context.server_tools.enabled.iter().map(|t| t.to_responses_json());
    let tools: Vec<Value> = client.chain(server).collect();
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
    }
    match (&context.tool_choice, choice) {
        (Some(name), ToolChoice::Enforce) => {
            body.insert("tool_choice".into(), json!({ "type": "function", "name": name }));
        }
        (Some(_), ToolChoice::Relax) => {
            body.insert("tool_choice".into(), json!("auto"));
        }
        (None, _) => {}
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

    #[test]
    fn a_forced_tool_is_relaxed_on_continuations() {
        let settings = crate::config::Settings::load(None).expect("defaults");
        let mut context = settings.conversation_context(None).expect("default context").clone();
        context.tool_choice = Some("read_file".into());
        let forced = envelope(&context, None, vec![], false, ToolChoice::Enforce);
        assert_eq!(forced["tool_choice"], json!({"type": "function", "name": "read_file"}));
        let relaxed = envelope(&context, Some("resp_1"), vec![], false, ToolChoice::Relax);
        assert_eq!(relaxed["tool_choice"], "auto");
        assert_eq!(relaxed["tools"], forced["tools"], "tools are still sent on every call");
        context.tool_choice = None;
        assert!(envelope(&context, None, vec![], false, ToolChoice::Relax)
            .get("tool_choice")
            .is_none());
    }
}
