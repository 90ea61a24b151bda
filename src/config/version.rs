//! Content versions of the contexts (issue 45, "versioned contexts"): a ConversationContext's
//! or AgentContext's version is a digest of what it is — boot prompt, tools, model, retrieval
//! settings, backends — so every response record can say which version produced it, and two
//! runs of the same id with different content can be told apart. Secrets never enter it (they
//! serialise as `***`), so rotating a key keeps the version.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use super::Settings;
use crate::contracts::ContextId;

/// Hex characters of a version: 64 bits, plenty to tell a configuration's versions apart.
const VERSION_HEX: usize = 16;

/// The version of `context`: the SHA-256 of its JSON with object keys sorted (the order a
/// configuration file lists them in changes nothing), first [`VERSION_HEX`] hex characters.
pub fn content_version<T: Serialize>(context: &T) -> String {
    let mut value = serde_json::to_value(context).unwrap_or(Value::Null);
    sort_keys(&mut value);
    let digest = Sha256::digest(value.to_string().as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..VERSION_HEX].to_owned()
}

/// The version of every configured context, computed once (a process's configuration does not
/// change while it runs).
#[derive(Debug, Clone, Default)]
pub struct ContextVersions {
    conversation: BTreeMap<String, String>,
    agent: BTreeMap<String, String>,
    default_conversation: String,
    default_agent: String,
}

impl ContextVersions {
    /// The versions of `settings`' contexts.
    pub fn of(settings: &Settings) -> Self {
        ContextVersions {
            conversation: settings
                .conversation_contexts
                .iter()
                .map(|(k, c)| (k.clone(), content_version(c)))
                .collect(),
            agent: settings
                .agent_contexts
                .iter()
                .map(|(k, a)| (k.clone(), content_version(a)))
                .collect(),
            default_conversation: settings.default_conversation_context.clone(),
            default_agent: settings.default_agent_context.clone(),
        }
    }

    /// A record's `context_versions` for a turn of these contexts (`None`: the defaults):
    /// `{"ConversationContext": {"Id", "Version"}, "AgentContext": {"Id", "Version"}}`.
    pub fn record(&self, conversation: Option<&ContextId>, agent: Option<&ContextId>) -> Value {
        let (conversation, agent) =
            (conversation.map(ContextId::as_str), agent.map(ContextId::as_str));
        self.record_by_id(conversation, agent).unwrap_or(Value::Null)
    }

    /// [`ContextVersions::record`] for ids read from a stored request; `None` when no context
    /// is known (a store built without the configuration's versions).
    pub fn record_by_id(&self, conversation: Option<&str>, agent: Option<&str>) -> Option<Value> {
        if self.conversation.is_empty() && self.agent.is_empty() {
            return None;
        }
        let one = |map: &BTreeMap<String, String>, id: Option<&str>, default: &str| {
            let id = id.unwrap_or(default);
            json!({ "Id": id, "Version": map.get(id) })
        };
        Some(json!({
            "ConversationContext": one(&self.conversation, conversation, &self.default_conversation),
            "AgentContext": one(&self.agent, agent, &self.default_agent),
        }))
    }
}

fn sort_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_same_content_in_any_key_order_has_one_version_and_a_change_another() {
        let a = json!({"model": "m", "tools": [{"name": "t", "parameters": {"a": 1, "b": 2}}]});
        let b = json!({"tools": [{"parameters": {"b": 2, "a": 1}, "name": "t"}], "model": "m"});
        let c = json!({"model": "m2", "tools": [{"name": "t", "parameters": {"a": 1, "b": 2}}]});
        assert_eq!(content_version(&a), content_version(&b));
        assert_ne!(content_version(&a), content_version(&c));
        assert_eq!(content_version(&a).len(), VERSION_HEX);
    }
}
