//! Server-owned contexts (DESIGN.md §4): ConversationContext (reasoning profile) and
//! AgentContext (which LLM endpoint, key and vector collection serve a request).

use serde::{Deserialize, Deserializer, Serialize};

use super::budget::{Budget, Usd};
use super::secret::{ConnectionUrl, Secret};
use super::ConfigError;

/// A reasoning profile, selected by `ConversationContextId`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationContext {
    /// Mode written into the `[MODE: …]` header, e.g. `DDR_CREATION`.
    pub mode: String,
    /// Display-only mode name returned to clients.
    pub mode_display_name: String,
    /// Model id sent as `model`.
    pub model: String,
    /// The boot prompt, sent as the system message on the first call of each chain.
    pub system_prompt: String,
    /// Function tools sent on every call.
    #[serde(default)]
    pub tools: Vec<FunctionTool>,
    /// A tool name to force (`{"type":"function","name":…}`); absent lets the model choose.
    #[serde(default)]
    pub tool_choice: Option<String>,
    /// Built-in tools the pipeline runs itself (`search_code`, `write_file`).
    #[serde(default)]
    pub server_tools: super::ServerTools,
    /// Sampling temperature, 0-2; absent uses the provider default.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// How many chunks retrieval returns at most.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Upper bound on the characters of retrieved chunk text per turn.
    #[serde(default = "default_chunk_budget")]
    pub chunk_budget_chars: usize,
    /// What a new user turn of this mode does when its session is busy with another turn.
    #[serde(default)]
    pub follow_up: FollowUp,
    /// The policies a request may choose instead with its `FollowUp` field (all by default);
    /// any other is refused with `context.follow_up_not_allowed`.
    #[serde(default = "every_follow_up")]
    pub follow_up_allowed: Vec<FollowUp>,
    /// Output tokens a call may produce at most, sent as `max_output_tokens`; required where a
    /// budget applies (it prices a call's worst case). Unset fields stay out of the context's
    /// serialised form, so adding them changed no existing context's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Spend of all turns in this mode, in US dollars per UTC day (docs/tenancy.md §7a).
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub usd_per_day: Usd,
    /// The same per UTC month.
    #[serde(default, skip_serializing_if = "Usd::is_zero")]
    pub usd_per_month: Usd,
}

pub use crate::contracts::FollowUp;

/// Every policy: what a request may choose unless its context narrows it.
fn every_follow_up() -> Vec<FollowUp> {
    vec![FollowUp::Enqueue, FollowUp::Reject, FollowUp::Interrupt, FollowUp::Steer]
}

fn default_top_k() -> usize {
    8
}

fn default_chunk_budget() -> usize {
    24_000
}

/// A Responses API function tool (flat shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionTool {
    /// Tool name, `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments. Written in the configuration as a JSON string so that
    /// its property names keep their case.
    #[serde(deserialize_with = "json_from_string")]
    pub parameters: serde_json::Value,
    /// Whether the provider enforces the schema strictly.
    #[serde(default)]
    pub strict: bool,
}

impl FunctionTool {
    /// The tool as a `/responses` `tools[]` entry.
    pub fn to_responses_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        })
    }
}

fn json_from_string<'de, D: Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
    let text = String::deserialize(d)?;
    serde_json::from_str(&text)
        .map_err(|e| serde::de::Error::custom(format!("parameters is not JSON: {e}")))
}

/// Which backends serve a request, selected by `AgentContextId`: the unit of tenant isolation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentContext {
    /// Overrides `llm.base_url` for this tenant.
    #[serde(default)]
    pub llm_base_url: Option<ConnectionUrl>,
    /// This context's own key (or set `APTIX__AGENT_CONTEXTS__<ID>__LLM_API_KEY`). A context
    /// with its own `llm_base_url` never falls back to `llm.api_key`.
    #[serde(default)]
    pub llm_api_key: Option<Secret>,
    /// A file holding this context's key (a mounted secret), read at each call, so replacing
    /// the file rotates the key without a restart. Wins over `llm_api_key`.
    #[serde(default)]
    pub llm_api_key_file: Option<std::path::PathBuf>,
    /// Vector collection (or embedded shard) holding this tenant's chunks.
    pub collection: String,
}

impl ConversationContext {
    /// Its money budget.
    pub fn budget(&self) -> Budget {
        Budget { per_day: self.usd_per_day, per_month: self.usd_per_month }
    }

    /// Checks one context; `key` is its configuration path for error messages.
    pub(super) fn check(&self, key: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, message: String| {
            Err(ConfigError::invalid(format!("{key}.{field}"), message))
        };
        for (field, value) in [
            ("mode", &self.mode),
            ("model", &self.model),
            ("mode_display_name", &self.mode_display_name),
        ] {
            if value.trim().is_empty() {
                return bad(field, "must not be empty".into());
            }
        }
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return bad("temperature", format!("{t} is outside 0-2"));
            }
        }
        if self.top_k == 0 {
            return bad("top_k", "must be at least 1".into());
        }
        if self.max_output_tokens.is_some_and(|n| n < 16) {
            // The Responses API's own minimum.
            return bad("max_output_tokens", "must be at least 16".into());
        }
        let mut names = std::collections::HashSet::new();
        for (i, tool) in self.tools.iter().enumerate() {
            let valid = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return bad(
                    &format!("tools[{i}].name"),
                    format!("`{}` is not a valid function name", tool.name),
                );
            }
            if !names.insert(tool.name.as_str()) {
                return bad(
                    &format!("tools[{i}].name"),
                    format!("`{}` is defined twice", tool.name),
                );
            }
            if !tool.parameters.is_object() {
                return bad(
                    &format!("tools[{i}].parameters"),
                    "must be a JSON object (a JSON Schema)".into(),
                );
            }
        }
        for tool in &self.server_tools.enabled {
            if !names.insert(tool.name()) {
                return bad(
                    "server_tools.enabled",
                    format!("`{}` is also a client tool; rename the client tool", tool.name()),
                );
            }
        }
        let mut servers = std::collections::HashSet::new();
        for (i, server) in self.server_tools.mcp.iter().enumerate() {
            let at = format!("server_tools.mcp[{i}]");
            server.check(&format!("{key}.{at}"))?;
            if !servers.insert(server.name.as_str()) {
                return bad(&format!("{at}.name"), format!("`{}` is defined twice", server.name));
            }
            for tool in &server.allowed_tools {
                let function = server.function_name(tool);
                if names.contains(function.as_str()) {
                    return bad(
                        &format!("{at}.allowed_tools"),
                        format!("`{function}` is also a client or built-in tool"),
                    );
                }
            }
        }
        let tools = &self.server_tools;
        for (i, rule) in tools.approvals.iter().enumerate() {
            let at = format!("{key}.server_tools.approvals[{i}]");
            rule.check(&at, |name| tools.is_server_tool(name))?;
        }
        if !super::approvals::EXPIRY_RANGE.contains(&tools.approval_expiry_seconds) {
            return bad(
                "server_tools.approval_expiry_seconds",
                format!("{} is outside 10-604800", tools.approval_expiry_seconds),
            );
        }
        if self.server_tools.max_rounds == 0 {
            return bad("server_tools.max_rounds", "must be at least 1".into());
        }
        if let Some(choice) = &self.tool_choice {
            if !names.contains(choice.as_str()) {
                return bad(
                    "tool_choice",
                    format!("`{choice}` is not one of this context's tools"),
                );
            }
        }
        Ok(())
    }
}

/// The name of the built-in contexts of the defaults file.
const BUILT_IN: &str = "default";

impl super::Settings {
    /// Drops the defaults file's `default` contexts when the operator's own sources (`own`: the
    /// file and the environment) make another the default and never name `default` (neither
    /// its table nor a tenant's list): a client naming `default` would otherwise get the
    /// example's model, tools and no budget, which the operator never configured.
    pub(super) fn drop_unnamed_defaults(&mut self, own: &config::Config) {
        let named = |table: &str| own.get_table(table).is_ok_and(|t| t.contains_key(BUILT_IN));
        let listed = |list: fn(&super::Tenant) -> &Vec<String>| {
            self.tenants.values().any(|t| list(t).iter().any(|c| c == BUILT_IN))
        };
        let drop_conversation = self.default_conversation_context != BUILT_IN
            && !named("conversation_contexts")
            && !listed(|t| &t.conversation_contexts);
        let drop_agent = self.default_agent_context != BUILT_IN
            && !named("agent_contexts")
            && !listed(|t| &t.agent_contexts);
        if drop_conversation {
            self.conversation_contexts.remove(BUILT_IN);
        }
        if drop_agent {
            self.agent_contexts.remove(BUILT_IN);
        }
    }
}
