//! The `/responses` request envelope (AGN-003 as corrected by DESIGN.md §5): `model`,
//! `previous_response_id` when continuing, `input`, and on every call the context's `tools`,
//! `tool_choice` and `temperature` (the live API does not carry them along a chain), the
//! `prompt_cache_key`, `store: true` (chaining needs stored responses) and `stream`.

use serde_json::{json, Map, Number, Value};
use sha2::{Digest as _, Sha256};

use crate::config::{AssemblePolicy, ConversationContext, PromptCacheKey};
use crate::contracts::SessionId;

/// Whether a configured `tool_choice` is enforced on this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// A user turn: the context's forced tool applies.
    Enforce,
    /// A tool continuation: `"auto"`, so the model can answer once it has the results instead
    /// of being forced to call the same tool again forever.
    Relax,
}

/// What a call adds to its context's settings.
pub(crate) struct Call<'a> {
    /// The response this call chains onto.
    pub previous_response_id: Option<&'a str>,
    /// Whether the call streams.
    pub stream: bool,
    /// Whether a forced tool applies.
    pub choice: ToolChoice,
    /// The provider's cache routing key ([`prompt_cache_key`]).
    pub prompt_cache_key: Option<String>,
    /// The function tools of the context's MCP servers, as listed for this call.
    pub mcp_tools: &'a [Value],
}

/// The `prompt_cache_key` of `session`'s calls: a digest, not the id itself, so the provider
/// learns nothing it could join with other data (its guide asks for no identifying data there),
/// 32 characters (the API caps the key at 64).
pub(crate) fn prompt_cache_key(policy: &AssemblePolicy, session: &SessionId) -> Option<String> {
    match policy.prompt_cache_key {
        PromptCacheKey::Session => {
            let digest = Sha256::digest(format!("aptix-session:{session}"));
            Some(format!("aptix-{}", &hex::encode(digest)[..26]))
        }
        PromptCacheKey::Off => None,
    }
}

/// Builds the request body. Fields are inserted in a fixed order so bodies are stable for
/// golden files and logs.
pub(crate) fn envelope(context: &ConversationContext, call: Call<'_>, input: Vec<Value>) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(context.model));
    if let Some(id) = call.previous_response_id {
        body.insert("previous_response_id".into(), json!(id));
    }
    body.insert("input".into(), Value::Array(input));
    let client = context.tools.iter().map(|t| t.to_responses_json());
    let server = context.server_tools.enabled.iter().map(|t| t.to_responses_json());
    let tools: Vec<Value> = client.chain(server).chain(call.mcp_tools.iter().cloned()).collect();
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
    }
    match (&context.tool_choice, call.choice) {
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
    if let Some(n) = context.max_output_tokens {
        body.insert("max_output_tokens".into(), json!(n));
    }
    if let Some(key) = call.prompt_cache_key {
        body.insert("prompt_cache_key".into(), json!(key));
    }
    body.insert("store".into(), json!(true));
    body.insert("stream".into(), json!(call.stream));
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
        let call = |previous, choice| Call {
            previous_response_id: previous,
            stream: false,
            choice,
            prompt_cache_key: None,
            mcp_tools: &[],
        };
        let forced = envelope(&context, call(None, ToolChoice::Enforce), vec![]);
        assert_eq!(forced["tool_choice"], json!({"type": "function", "name": "read_file"}));
        let relaxed = envelope(&context, call(Some("resp_1"), ToolChoice::Relax), vec![]);
        assert_eq!(relaxed["tool_choice"], "auto");
        assert_eq!(relaxed["tools"], forced["tools"], "tools are still sent on every call");
        context.tool_choice = None;
        assert!(envelope(&context, call(None, ToolChoice::Relax), vec![])
            .get("tool_choice")
            .is_none());
        assert!(forced.get("prompt_cache_key").is_none(), "no key, no field");
    }

    #[test]
    fn a_session_has_one_opaque_cache_key() {
        let mut policy = AssemblePolicy::default();
        let (a, b): (SessionId, SessionId) = (
            "5f0c6f7e-8d1a-4b6e-9c3d-1a2b3c4d5e6f".parse().expect("id"),
            "6f0c6f7e-8d1a-4b6e-9c3d-1a2b3c4d5e6f".parse().expect("id"),
        );
        let key = prompt_cache_key(&policy, &a).expect("a key by default");
        assert_eq!(prompt_cache_key(&policy, &a).as_deref(), Some(key.as_str()), "stable");
        assert_ne!(prompt_cache_key(&policy, &b).as_deref(), Some(key.as_str()));
        assert!(!key.contains(&a.to_string()[..8]), "the id itself is not sent: {key}");
        assert!(key.len() <= 64, "the API's limit");
        policy.prompt_cache_key = PromptCacheKey::Off;
        assert_eq!(prompt_cache_key(&policy, &a), None);
    }
}
