//! MCP servers a ConversationContext offers tools from (docs/tools.md, "MCP servers"): where each
//! one is (Streamable HTTP, or a command speaking stdio for local development), which of its
//! tools the model may call, what the pipeline sends it, and the bounds on a call.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The separator between a server's name and its tool's in the function name the model sees
/// (`tickets__open_ticket`).
pub const SEPARATOR: &str = "__";

/// One MCP server of a context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// Its name in the context: letters, digits and `-`, at most 24 characters; the prefix of
    /// its tools' function names.
    pub name: String,
    /// Its Streamable HTTP endpoint (`https://tools.example.com/mcp`); a password or a secret
    /// query value in it (`?api_key=`) is hidden wherever it is printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<super::ConnectionUrl>,
    /// Or a program and its arguments that speak MCP over stdio (local development: each
    /// worker process starts its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The tools the model may call; the server's others are never offered (deny by default).
    pub allowed_tools: Vec<String>,
    /// Tools that may run again after a call was cut short (they receive the same idempotency
    /// key each time); any other tool's cut-short call is reported as of unknown outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idempotent_tools: Vec<String>,
    /// Headers sent with every HTTP request to it (their values are secrets: redacted from
    /// `aptix config`, logs and the context's version).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, super::Secret>,
    /// A file holding a bearer token sent as `Authorization` (a mounted secret, read when the
    /// worker connects, never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// How long one call (or listing its tools) may take, milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Largest output of one call passed to the model, bytes; a larger one fails the call.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: usize,
    /// Calls in flight to it from one worker at most; one over it fails at once ("busy"), so a
    /// slow server holds a bounded share of the stage.
    #[serde(default = "default_max_concurrent_calls")]
    pub max_concurrent_calls: u32,
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_max_output_bytes() -> usize {
    64 * 1024
}

fn default_max_concurrent_calls() -> u32 {
    4
}

/// Longest a call may be allowed to take.
const MAX_TIMEOUT_MS: u64 = 120_000;
/// Largest output a call may be allowed to pass on.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

impl McpServer {
    /// The function name the model calls for `tool`.
    pub fn function_name(&self, tool: &str) -> String {
        format!("{}{SEPARATOR}{tool}", self.name)
    }

    /// Whether `tool` may run again after a call of it was cut short.
    pub fn idempotent(&self, tool: &str) -> bool {
        self.idempotent_tools.iter().any(|t| t == tool)
    }

    /// Checks one server; `key` is its configuration path.
    pub(super) fn check(&self, key: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, message: String| {
            Err(ConfigError::invalid(format!("{key}.{field}"), message))
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 24
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !name_ok {
            return bad("name", format!("`{}`: use 1-24 letters, digits or `-`", self.name));
        }
        match (&self.url, self.command.is_empty()) {
            (Some(_), false) | (None, true) => {
                return bad("url", "give exactly one of `url` (HTTP) and `command` (stdio)".into())
            }
            (Some(url), true)
                if !(url.expose().starts_with("https://")
                    || url.expose().starts_with("http://")) =>
            {
                return bad("url", format!("`{url}` is not an http(s) URL"));
            }
            _ => {}
        }
        if self.allowed_tools.is_empty() {
            return bad("allowed_tools", "list the tools the model may call".into());
        }
        for tool in self.allowed_tools.iter().chain(&self.idempotent_tools) {
            let function = self.function_name(tool);
            let valid = !tool.is_empty()
                && function.len() <= 64
                && tool.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return bad("allowed_tools", format!("`{tool}`: `{function}` is no function name"));
            }
        }
        if let Some(t) = self.idempotent_tools.iter().find(|t| !self.allowed_tools.contains(t)) {
            return bad("idempotent_tools", format!("`{t}` is not in `allowed_tools`"));
        }
        if !(100..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return bad(
                "timeout_ms",
                format!("{} is outside 100-{MAX_TIMEOUT_MS}", self.timeout_ms),
            );
        }
        if self.max_output_bytes == 0 || self.max_output_bytes > MAX_OUTPUT_BYTES {
            let n = self.max_output_bytes;
            return bad("max_output_bytes", format!("{n} is outside 1-{MAX_OUTPUT_BYTES}"));
        }
        if self.max_concurrent_calls == 0 {
            return bad("max_concurrent_calls", "must be at least 1".into());
        }
        Ok(())
    }
}
