//! MCP servers as server tools (docs/tools.md, "MCP servers"), through the official Rust SDK
//! (`rmcp`): per process, one connection to each server a context lists, opened on first use and
//! again after it broke; the tools it offers, listed and kept a while, as `/responses` function
//! tools named `<server>__<tool>`; and calls bounded by the server's timeout, its output cap and
//! its share of the stage (`max_concurrent_calls`), so a server that hangs or floods costs a
//! bounded part of one stage and nothing else.
//!
//! What a server sees of a turn: the call's arguments, the configured headers and token, and an
//! idempotency key (a digest of the call's identity) in the request's `_meta`; never the session,
//! tenant, instruction or anything else the model was sent.

mod output;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::config::McpServer;

pub use output::McpError;

/// How long a server's tool list is kept before it is listed again.
const TOOLS_KEPT: Duration = Duration::from_secs(300);

type Connection = RunningService<RoleClient, ()>;

/// The MCP servers of every context, as this process reaches them.
#[derive(Default)]
pub struct Hub {
    servers: Mutex<HashMap<(String, String), Arc<Server>>>,
}

/// One server of one context.
struct Server {
    config: McpServer,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    tools: Mutex<Option<(Instant, Vec<Value>)>>,
    slots: Semaphore,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub that has reached no server yet.
    pub fn new() -> Hub {
        Hub::default()
    }

    fn server(&self, context: &str, config: &McpServer) -> Arc<Server> {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (context.to_owned(), config.name.clone());
        let entry = servers.entry(key).or_insert_with(|| Arc::new(Server::new(config)));
        if entry.config != *config {
            // Reconfigured (a context's newer version): a fresh connection for the new settings.
            *entry = Arc::new(Server::new(config));
        }
        entry.clone()
    }

    /// The function tools context `context` offers from `servers`, as `/responses` `tools[]`
    /// entries, allowed tools only; a server that cannot be listed now is left out (logged),
    /// and the turn goes on without its tools.
    pub async fn tools(&self, context: &str, servers: &[McpServer]) -> Vec<Value> {
        let mut out = Vec::new();
        for config in servers {
            match self.server(context, config).tools().await {
                Ok(tools) => out.extend(tools),
                Err(e) => tracing::warn!(
                    context, server = %config.name, error = %e,
                    "mcp server tools not offered: it could not be listed"
                ),
            }
        }
        out
    }

    /// Calls `tool` of `config` with `arguments` (a JSON object, as the model wrote it) and
    /// `idempotency_key` in the request's `_meta`: the output the model gets, or why it has none.
    pub async fn call(
        &self,
        context: &str,
        config: &McpServer,
        tool: &str,
        arguments: &str,
        idempotency_key: &str,
    ) -> Result<String, McpError> {
        let arguments = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(McpError::Arguments("not a JSON object".into())),
            Err(e) => return Err(McpError::Arguments(e.to_string())),
        };
        let server = self.server(context, config);
        let Ok(_slot) = server.slots.try_acquire() else {
            return Err(McpError::Busy(config.max_concurrent_calls));
        };
        let meta: RequestMetaObject =
            serde_json::from_value(json!({ "aptix/idempotency_key": idempotency_key }))
                .map_err(|e| McpError::Call(e.to_string()))?;
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.meta = Some(meta);
        let timeout = Duration::from_millis(config.timeout_ms);
        let connection = server.connect(timeout).await?;
        let answer = tokio::time::timeout(timeout, connection.call_tool(params)).await;
        let result = match answer {
            Err(_) => {
                server.forget(&connection).await;
                return Err(McpError::Timeout(config.timeout_ms));
            }
            Ok(Err(e)) => {
                server.forget(&connection).await;
                return Err(McpError::Call(e.to_string()));
            }
            Ok(Ok(result)) => result,
        };
        let result = serde_json::to_value(result).map_err(|e| McpError::Call(e.to_string()))?;
        output::text(&result, config.max_output_bytes)
    }
}

impl Server {
    fn new(config: &McpServer) -> Server {
        let slots = usize::try_from(config.max_concurrent_calls).unwrap_or(1);
        Server {
            config: config.clone(),
            connection: tokio::sync::Mutex::new(None),
            tools: Mutex::new(None),
            slots: Semaphore::new(slots),
        }
    }

    /// The open connection, or a new one.
    async fn connect(&self, timeout: Duration) -> Result<Arc<Connection>, McpError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let opened = tokio::time::timeout(timeout, self.open()).await;
        let connection = Arc::new(opened.map_err(|_| McpError::Timeout(self.config.timeout_ms))??);
        *slot = Some(connection.clone());
        Ok(connection)
    }

    async fn open(&self) -> Result<Connection, McpError> {
        let c = &self.config;
        let connect = |e: &dyn std::fmt::Display| McpError::Connect(e.to_string());
        if let Some(url) = &c.url {
            // Room for the output cap and the JSON-RPC envelope around it; more is cut off at
            // the transport, not buffered.
            let limit = c.max_output_bytes.saturating_mul(2).saturating_add(64 * 1024);
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(output::headers(&c.headers).map_err(|e| connect(&e))?)
                .max_json_response_size(limit)
                .max_sse_event_size(limit);
            if let Some(file) = &c.token_file {
                let token = std::fs::read_to_string(file).map_err(|e| connect(&e))?;
                config = config.auth_header(token.trim().to_owned());
            }
            let http = crate::http::client().build().map_err(|e| connect(&e))?;
            let transport = StreamableHttpClientTransport::with_client(http, config);
            ().serve(transport).await.map_err(|e| connect(&e))
        } else {
            let (program, args) = c.command.split_first().ok_or_else(|| connect(&"no command"))?;
            let mut command = tokio::process::Command::new(program);
            command.args(args).kill_on_drop(true);
            let transport = TokioChildProcess::new(command).map_err(|e| connect(&e))?;
            ().serve(transport).await.map_err(|e| connect(&e))
        }
    }

    /// Drops `broken` so that the next call connects again.
    async fn forget(&self, broken: &Arc<Connection>) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, broken)) {
            *slot = None;
        }
    }

    /// The allowed tools as function tools, listed again once [`TOOLS_KEPT`] passed.
    async fn tools(&self) -> Result<Vec<Value>, McpError> {
        let kept = self.tools.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some((at, tools)) = &kept {
            if at.elapsed() < TOOLS_KEPT {
                return Ok(tools.clone());
            }
        }
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let listed = match self.list(timeout).await {
            Ok(listed) => listed,
            // A server that was listed before keeps its tools while it cannot be listed again.
            Err(e) => return kept.map(|(_, tools)| tools).ok_or(e),
        };
        let tools = output::functions(&self.config, &listed);
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), tools.clone()));
        Ok(tools)
    }

    async fn list(&self, timeout: Duration) -> Result<Vec<Value>, McpError> {
        let connection = self.connect(timeout).await?;
        let listed = tokio::time::timeout(timeout, connection.list_all_tools()).await;
        let listed = match listed {
            Err(_) => Err(McpError::Timeout(self.config.timeout_ms)),
            Ok(Err(e)) => Err(McpError::Call(e.to_string())),
            Ok(Ok(tools)) => Ok(tools),
        };
        let tools = match listed {
            Ok(tools) => tools,
            Err(e) => {
                self.forget(&connection).await;
                return Err(e);
            }
        };
        tools
            .iter()
            .map(|t| serde_json::to_value(t).map_err(|e| McpError::Call(e.to_string())))
            .collect()
    }
}
