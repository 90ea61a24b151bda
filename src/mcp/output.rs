//! What an MCP server's answers become: its allowed tools as `/responses` function tools, a
//! call's result as the text the model reads (bounded), and why a call gave none.

use std::collections::{BTreeMap, HashMap};

use http::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::config::{McpServer, Secret};

/// Why an MCP call gave the model no output; its text is what the model reads.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// The arguments the model wrote are not a JSON object.
    #[error("invalid arguments: {0}")]
    Arguments(String),
    /// The server already has its `max_concurrent_calls` calls from this worker.
    #[error("the tool server is busy ({0} calls in flight); try again later")]
    Busy(u32),
    /// The server could not be reached.
    #[error("the tool server could not be reached: {0}")]
    Connect(String),
    /// No answer within the server's timeout.
    #[error("the tool server did not answer within {0} ms")]
    Timeout(u64),
    /// The call failed on the way, after it was sent (a transport or protocol error).
    #[error("the tool call failed: {0}")]
    Call(String),
    /// The server answered the request with an error: it did not run the tool.
    #[error("the tool server refused the call: {0}")]
    Refused(String),
    /// The tool ran and reported an error.
    #[error("the tool reported an error: {0}")]
    Tool(String),
    /// The output is over the server's cap (the tool ran).
    #[error("the tool ran, but its output is {bytes} bytes; at most {max} are passed on")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The cap.
        max: usize,
    },
}

impl McpError {
    /// Whether the tool may have run although the call failed: sent, but no answer came back.
    /// Its effect is unknown (docs/tools.md, "Effects").
    pub fn sent_without_answer(&self) -> bool {
        matches!(self, McpError::Timeout(_) | McpError::Call(_))
    }
}

/// The configured headers, checked.
pub(super) fn headers(
    configured: &BTreeMap<String, Secret>,
) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    configured
        .iter()
        .map(|(k, v)| {
            let name = HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k}: {e}"))?;
            let mut value =
                HeaderValue::try_from(v.expose()).map_err(|_| format!("header {k}: invalid"))?;
            value.set_sensitive(true);
            Ok((name, value))
        })
        .collect()
}

/// `text` as the model, the record and the client may get it from a server: at most `max`
/// bytes (cut at a character boundary), without NUL characters, which PostgreSQL's text and
/// JSON refuse.
pub(super) fn clip(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace('\0', "")
}

/// `text` without the server's `url`, which the HTTP client names in its errors (`… for url
/// (…)`): it may carry a key in its query or name an internal host, and the text reaches the
/// model, the record and the client.
pub(super) fn without_url(text: &str, url: Option<&str>) -> String {
    let Some(url) = url.filter(|u| !u.is_empty()) else { return text.to_owned() };
    // As the client prints it (normalised: a `/` added to a bare host, say), then as configured.
    let parsed = url::Url::parse(url).map(String::from).unwrap_or_default();
    [parsed.as_str(), url]
        .into_iter()
        .filter(|form| !form.is_empty())
        .fold(text.to_owned(), |text, form| text.replace(form, "<the server's url>"))
}

/// Most bytes of a listed tool's description offered to the model (the rest is cut).
pub const MAX_TOOL_DESCRIPTION_BYTES: usize = 4 * 1024;
/// Most bytes of a listed tool's input schema, as JSON; a tool with a larger one is left out.
/// Every definition goes into every `/responses` body of the context, whoever's turn it is.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// The server's allowed tools (as `tools/list` gave them) as `/responses` function tools, each
/// bounded: its description cut to [`MAX_TOOL_DESCRIPTION_BYTES`], a schema larger than
/// [`MAX_TOOL_SCHEMA_BYTES`] (or holding a NUL, which no stored request may) leaving it out.
pub(super) fn functions(config: &McpServer, listed: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = listed
        .iter()
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?;
            if !config.allowed_tools.iter().any(|a| a == name) {
                return None;
            }
            let schema = t.get("inputSchema").filter(|s| s.is_object());
            let written = schema.map(Value::to_string).unwrap_or_default();
            if written.len() > MAX_TOOL_SCHEMA_BYTES || written.contains("\\u0000") {
                let bytes = written.len();
                tracing::warn!(server = %config.name, tool = name, bytes, "tool left out: its input schema is too large or holds a NUL");
                return None;
            }
            let description = t.get("description").and_then(Value::as_str).unwrap_or("");
            Some(json!({
                "type": "function",
                "name": config.function_name(name),
                "description": clip(description, MAX_TOOL_DESCRIPTION_BYTES),
                "parameters": schema.cloned().unwrap_or_else(|| json!({"type": "object"})),
                "strict": false,
            }))
        })
        .collect();
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    // A server listing a name twice gets it offered once (the provider refuses duplicates).
    out.dedup_by(|a, b| a["name"] == b["name"]);
    out
}

/// A `tools/call` result as the text the model reads: its text blocks joined (other blocks as
/// their JSON), or its structured content; an error result is an error.
pub(super) fn text(result: &Value, max: usize) -> Result<String, McpError> {
    let blocks = result.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let mut text: String = blocks
        .iter()
        .map(|b| {
            match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => t.to_owned(),
                _ => b.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    if text.is_empty() {
        if let Some(structured) = result.get("structuredContent") {
            text = structured.to_string();
        }
    }
    if text.len() > max {
        return Err(McpError::TooLarge { bytes: text.len(), max });
    }
    let text = clip(&text, max);
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(McpError::Tool(text));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> McpServer {
        toml::from_str(
            r#"name = "tickets"
               url = "http://127.0.0.1:1/mcp"
               allowed_tools = ["open_ticket"]"#,
        )
        .unwrap()
    }

    #[test]
    fn only_allowed_tools_are_offered_under_the_servers_name() {
        let listed = [
            json!({"name": "open_ticket", "description": "Opens", "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}}}),
            json!({"name": "drop_database", "inputSchema": {"type": "object"}}),
        ];
        let tools = functions(&server(), &listed);
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0]["name"], "tickets__open_ticket");
        assert_eq!(tools[0]["parameters"]["properties"]["title"]["type"], "string");
    }

    #[test]
    fn a_tools_definition_is_bounded_or_left_out() {
        let long = "d".repeat(MAX_TOOL_DESCRIPTION_BYTES * 2);
        let huge = json!({"type": "object", "description": "x".repeat(MAX_TOOL_SCHEMA_BYTES)});
        let mut config = server();
        config.allowed_tools.push("huge".into());
        config.allowed_tools.push("nul".into());
        let listed = [
            json!({"name": "open_ticket", "description": long, "inputSchema": {"type": "object"}}),
            json!({"name": "huge", "inputSchema": huge}),
            json!({"name": "nul", "inputSchema": {"type": "object", "description": "a\u{0}b"}}),
        ];
        let tools = functions(&config, &listed);
        assert_eq!(tools.len(), 1, "{tools:?}");
        assert_eq!(tools[0]["description"].as_str().unwrap().len(), MAX_TOOL_DESCRIPTION_BYTES);
    }

    #[test]
    fn results_become_bounded_text_and_errors_stay_errors() {
        let ok =
            json!({"content": [{"type": "text", "text": "done"}, {"type": "text", "text": "2"}]});
        assert_eq!(text(&ok, 100).unwrap(), "done\n2");
        let structured = json!({"content": [], "structuredContent": {"n": 1}});
        assert_eq!(text(&structured, 100).unwrap(), r#"{"n":1}"#);
        let failed = json!({"content": [{"type": "text", "text": "read-only"}], "isError": true});
        assert!(matches!(text(&failed, 100), Err(McpError::Tool(t)) if t == "read-only"));
        let big = json!({"content": [{"type": "text", "text": "x".repeat(101)}]});
        assert!(matches!(text(&big, 100), Err(McpError::TooLarge { bytes: 101, max: 100 })));
    }

    #[test]
    fn server_text_is_clipped_on_a_character_and_loses_its_nuls() {
        assert_eq!(clip("a\0b", 10), "ab");
        assert_eq!(clip("ééé", 3), "é");
        let failed = json!({"content": [{"type": "text", "text": "x\u{0}y"}], "isError": true});
        assert!(matches!(text(&failed, 100), Err(McpError::Tool(t)) if t == "xy"));
    }
}

#[cfg(test)]
mod url_tests {
    #[test]
    fn the_servers_url_is_not_in_what_the_model_reads() {
        let url = "https://mcp.example.com?api_key=SECRET";
        let error = "error sending request for url (https://mcp.example.com/?api_key=SECRET)";
        let text = super::without_url(error, Some(url));
        assert_eq!(text, "error sending request for url (<the server's url>)");
        assert_eq!(
            super::without_url("as configured: https://mcp.example.com?api_key=SECRET", Some(url)),
            "as configured: <the server's url>"
        );
        assert_eq!(super::without_url("no url", None), "no url");
    }
}
