//! Approval gates (`[[conversation_contexts.X.server_tools.approvals]]`, docs/tools.md
//! "Approvals"): which server tool calls wait for the client's approval before they run, always
//! or when an argument matches a pattern, and how long a request waits before its calls are
//! denied.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::ConfigError;
use crate::contracts::ToolCall;

/// One rule: calls of `tool` need approval, always or when `argument` matches `matches`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// The function name: a built-in (`write_file`) or an MCP tool (`<server>__<tool>`).
    pub tool: String,
    /// A JSON Pointer into the call's arguments (`/priority`); with `matches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument: Option<String>,
    /// A regular expression the argument is matched against (a string as it is, any other
    /// value as its JSON text); with `argument`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Pattern>,
}

impl ApprovalRule {
    /// Whether `call` needs approval under this rule. Fails closed: arguments that are not
    /// JSON, or lack the argument, need approval.
    pub fn applies(&self, call: &ToolCall) -> bool {
        if call.name != self.tool {
            return false;
        }
        let (Some(pointer), Some(pattern)) = (&self.argument, &self.matches) else {
            return true;
        };
        let Ok(args) = serde_json::from_str::<Value>(&call.arguments_json) else { return true };
        match args.pointer(pointer) {
            None => true,
            Some(Value::String(s)) => pattern.0.is_match(s),
            Some(other) => pattern.0.is_match(&other.to_string()),
        }
    }

    /// Checks the rule at start: `key` names it in errors; `is_server_tool` says whether a
    /// function name runs in the pipeline for this context.
    pub(super) fn check(
        &self,
        key: &str,
        is_server_tool: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        if !is_server_tool(&self.tool) {
            return Err(ConfigError::invalid(
                format!("{key}.tool"),
                format!("`{}` is not a built-in or allowed MCP tool of this context", self.tool),
            ));
        }
        match (&self.argument, &self.matches) {
            (None, None) => Ok(()),
            (Some(p), Some(_)) if p.starts_with('/') => Ok(()),
            (Some(_), Some(_)) => Err(ConfigError::invalid(
                format!("{key}.argument"),
                "must be a JSON Pointer such as `/path`".to_owned(),
            )),
            _ => Err(ConfigError::invalid(
                key.to_owned(),
                "`argument` and `matches` go together".to_owned(),
            )),
        }
    }
}

/// A regular expression, compiled when the configuration is read.
#[derive(Debug, Clone)]
pub struct Pattern(pub regex::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        // Bounded: a pattern is the operator's, but its compiled size still costs every call.
        regex::RegexBuilder::new(&text)
            .size_limit(1 << 20)
            .build()
            .map(Pattern)
            .map_err(serde::de::Error::custom)
    }
}

/// Shortest and longest `approval_expiry_seconds`.
pub const EXPIRY_RANGE: std::ops::RangeInclusive<u32> = 10..=7 * 24 * 3600;

/// Default `approval_expiry_seconds`: one hour.
pub fn default_expiry() -> u32 {
    3600
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall { tool_call_id: "c".into(), name: name.into(), arguments_json: args.into() }
    }

    fn rule(argument: Option<&str>, matches: Option<&str>) -> ApprovalRule {
        ApprovalRule {
            tool: "t__open".into(),
            argument: argument.map(str::to_owned),
            matches: matches.map(|m| Pattern(regex::Regex::new(m).unwrap())),
        }
    }

    #[test]
    fn a_rule_without_argument_gates_every_call_of_its_tool_only() {
        assert!(rule(None, None).applies(&call("t__open", "{}")));
        assert!(!rule(None, None).applies(&call("t__other", "{}")));
    }

    #[test]
    fn an_argument_rule_gates_matches_and_fails_closed() {
        let r = rule(Some("/priority"), Some("^(high|urgent)$"));
        assert!(r.applies(&call("t__open", r#"{"priority":"high"}"#)));
        assert!(!r.applies(&call("t__open", r#"{"priority":"low"}"#)));
        assert!(r.applies(&call("t__open", r#"{"title":"x"}"#)), "absent argument");
        assert!(r.applies(&call("t__open", "not json")), "unparsable arguments");
        let n = rule(Some("/n"), Some("^[5-9]$"));
        assert!(n.applies(&call("t__open", r#"{"n":7}"#)), "numbers by their JSON text");
    }
}
