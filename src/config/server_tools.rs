//! Server-executed tools (AGN-033 §5.3: their results appear in a final response's
//! `ToolResults[]` for visibility): which built-ins a ConversationContext offers, the function
//! definitions the model sees, and where produced files are kept and served.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A built-in tool the pipeline runs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerTool {
    /// Retrieval over the session's scope: `{"query", "path_prefix"?, "language"?}`.
    SearchCode,
    /// Stores a file content-addressed and returns a `FileRef`: `{"path", "content",
    /// "mime_type"?}`.
    WriteFile,
}

impl ServerTool {
    /// Every built-in.
    pub const ALL: [ServerTool; 2] = [ServerTool::SearchCode, ServerTool::WriteFile];

    /// The function name the model calls.
    pub fn name(self) -> &'static str {
        match self {
            ServerTool::SearchCode => "search_code",
            ServerTool::WriteFile => "write_file",
        }
    }

    /// The built-in called `name`.
    pub fn named(name: &str) -> Option<ServerTool> {
        ServerTool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The `/responses` `tools[]` entry (strict: every property required, optional ones
    /// nullable, as the live API demands of strict schemas).
    pub fn to_responses_json(self) -> Value {
        let (description, properties, required) = match self {
            ServerTool::SearchCode => (
                "Search the indexed source code of this session's repository. Returns the best \
                 matching chunks with their Id, Path, StartLine, EndLine and Text.",
                json!({
                    "query": {"type": "string", "description": "What to look for"},
                    "path_prefix": {"type": ["string", "null"], "description": "Only paths under this prefix"},
                    "language": {"type": ["string", "null"], "description": "Only this language, e.g. rust"}
                }),
                json!(["query", "path_prefix", "language"]),
            ),
            ServerTool::WriteFile => (
                "Produce a file for the user (a patch, a report, generated code). It is stored \
                 and referenced in the answer; do not repeat its content in the answer.",
                json!({
                    "path": {"type": "string", "description": "Workspace-relative file name"},
                    "content": {"type": "string", "description": "The whole file content"},
                    "mime_type": {"type": ["string", "null"], "description": "e.g. text/x-diff"}
                }),
                json!(["path", "content", "mime_type"]),
            ),
        };
        json!({
            "type": "function",
            "name": self.name(),
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false
            },
            "strict": true,
        })
    }
}

/// Files that server tools produce (`write_file`): kept in PostgreSQL by their SHA-256 and
/// served by `GET /files/<sha256>` on each worker's HTTP listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// Base of the `Url` in a `FileRef`: where clients reach a worker's HTTP listener, e.g.
    /// behind a load balancer. Unset: the listener's own address (`telemetry.metrics_listen`,
    /// see [`crate::config::Settings::files_base_url`]).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Where files are served when not on the metrics listener (`host:port`): the address to
    /// publish to clients, which then reach neither `/metrics` (every tenant's spend) nor the
    /// health probes. Empty: on `telemetry.metrics_listen`.
    #[serde(default)]
    pub listen: String,
    /// How long a produced file is served after it was last written.
    #[serde(default = "default_retention_hours")]
    pub retention_hours: u32,
    /// Largest file content a tool may write, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
}

impl Default for FileSettings {
    fn default() -> Self {
        FileSettings {
            base_url: None,
            listen: String::new(),
            retention_hours: default_retention_hours(),
            max_bytes: default_max_bytes(),
        }
    }
}

fn default_retention_hours() -> u32 {
    24 * 7
}

fn default_max_bytes() -> usize {
    1 << 20
}

fn default_rounds() -> u32 {
    4
}

/// The server tools of a ConversationContext.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTools {
    /// The built-ins offered to the model next to the client tools.
    #[serde(default)]
    pub enabled: Vec<ServerTool>,
    /// Round trips of one turn that may run server tools; the turn fails past it.
    #[serde(default = "default_rounds")]
    pub max_rounds: u32,
    /// MCP servers whose allowed tools are offered too (`[[...server_tools.mcp]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<super::McpServer>,
    /// Calls that wait for the client's approval before they run (`[[...server_tools.approvals]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<super::ApprovalRule>,
    /// How long an approval request waits before its calls are denied.
    #[serde(default = "super::approvals::default_expiry")]
    pub approval_expiry_seconds: u32,
}

impl Default for ServerTools {
    fn default() -> Self {
        ServerTools {
            enabled: Vec::new(),
            max_rounds: default_rounds(),
            mcp: Vec::new(),
            approvals: Vec::new(),
            approval_expiry_seconds: super::approvals::default_expiry(),
        }
    }
}

impl ServerTools {
    /// Whether `name` is one of the enabled built-ins.
    pub fn runs(&self, name: &str) -> Option<ServerTool> {
        ServerTool::named(name).filter(|t| self.enabled.contains(t))
    }

    /// The MCP server and tool that function `name` calls, if it is an allowed MCP tool.
    pub fn mcp_tool(&self, name: &str) -> Option<(&super::McpServer, &str)> {
        let (server, tool) = name.split_once(super::mcp::SEPARATOR)?;
        let server = self.mcp.iter().find(|s| s.name == server)?;
        let tool = server.allowed_tools.iter().find(|t| *t == tool)?;
        Some((server, tool.as_str()))
    }

    /// Whether function `name` runs in the pipeline (a built-in or an allowed MCP tool).
    pub fn is_server_tool(&self, name: &str) -> bool {
        self.runs(name).is_some() || self.mcp_tool(name).is_some()
    }

    /// Whether `call` waits for the client's approval before it runs.
    pub fn requires_approval(&self, call: &crate::contracts::ToolCall) -> bool {
        self.approvals.iter().any(|rule| rule.applies(call))
    }

    /// When an approval request made now expires.
    pub fn approval_expires_at(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + chrono::Duration::seconds(i64::from(self.approval_expiry_seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_strict_objects_naming_every_property() {
        for tool in ServerTool::ALL {
            let def = tool.to_responses_json();
            let params = &def["parameters"];
            let props = params["properties"].as_object().unwrap();
            let required: Vec<&str> =
                params["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            assert_eq!(props.len(), required.len(), "{def}");
            assert!(required.iter().all(|r| props.contains_key(*r)));
            assert_eq!(ServerTool::named(tool.name()), Some(tool));
        }
    }
}
