//! MCP servers as server tools (docs/tools.md, "MCP servers"), through the official Rust SDK
//! (`rmcp`): per process, one connection to each configured server, opened on first use and
//! again after it broke; the tools it offers, listed and kept a while, as `/responses` function
//! tools named `<server>__<tool>`; and calls bounded by the server's timeout (connecting
//! included), its output cap and its share of the stage (`max_concurrent_calls`), so a server
//! that hangs, floods or drops connections costs a bounded part of one stage and nothing else.
//!
//! What a server sees of a turn: the call's arguments, the configured headers and token, and an
//! idempotency key (a digest of the call's identity) in the request's `_meta`; never the session,
//! tenant, instruction or anything else the model was sent.

mod connect;
mod output;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, PaginatedRequestParams, RequestMetaObject};
use rmcp::service::ServiceError;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::config::McpServer;
use connect::Connector;

pub use output::McpError;

/// How long a server's tool list is kept before it is listed again.
const TOOLS_KEPT: Duration = Duration::from_secs(300);
/// How long after a failed listing a server is not asked again: turns of its context are
/// assembled without its tools meanwhile, instead of each waiting its timeout.
const LISTING_BACKOFF: Duration = Duration::from_secs(30);
/// Pages of `tools/list` read at most (a server that pages forever is cut off).
const MAX_PAGES: usize = 8;
/// How long a turn's assembly waits for a server's first listing (or its server's timeout, if
/// shorter); past it the turn goes on without the server's tools while the listing goes on for
/// later turns. A listing due again never holds a turn: it gets the kept list meanwhile.
const FIRST_LISTING_WAIT: Duration = Duration::from_secs(5);

/// The MCP servers of every context, as this process reaches them: one entry per distinct
/// server configuration, so a server two contexts list alike shares its connection and its
/// `max_concurrent_calls`.
#[derive(Default)]
pub struct Hub {
    servers: Mutex<HashMap<String, Arc<Server>>>,
}

/// One configured server.
struct Server {
    config: McpServer,
    connector: Connector,
    tools: Mutex<Option<(Instant, Vec<Value>)>>,
    /// When listing last failed, and why.
    failed: Mutex<Option<(Instant, McpError)>>,
    /// Held while the server is listed: one listing at a time, whatever the turns asking.
    listing: Arc<tokio::sync::Mutex<()>>,
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

    fn server(&self, config: &McpServer) -> Arc<Server> {
        // The whole configuration is the key: a context's newer version with other settings
        // gets a fresh connection for them.
        let secrets: Vec<&str> = config.headers.values().map(|s| s.expose()).collect();
        let key = serde_json::to_string(config).unwrap_or_else(|_| config.name.clone());
        let key = format!("{key}\u{0}{}", secrets.join("\u{1}"));
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        servers.entry(key).or_insert_with(|| Arc::new(Server::new(config))).clone()
    }

    /// The function tools of `servers`, as `/responses` `tools[]` entries, allowed tools only;
    /// a server that cannot be listed now is left out (logged where listing fails, once per
    /// backoff), and the turn goes on without its tools.
    pub async fn tools(&self, servers: &[McpServer]) -> Vec<Value> {
        let listed = servers.iter().map(|config| {
            let server = self.server(config);
            async move { server.tools().await.unwrap_or_default() }
        });
        // Names cannot collide: each server's are under its own name, unique in the context
        // (checked at start), and `output::functions` offers each of them once.
        futures_util::future::join_all(listed).await.concat()
    }

    /// Calls `tool` of `config` with `arguments` (a JSON object, as the model wrote it) and
    /// `idempotency_key` in the request's `_meta`: the output the model gets, or why it has none.
    /// Connecting and calling share one deadline, the server's `timeout_ms`.
    pub async fn call(
        &self,
        config: &McpServer,
        tool: &str,
        arguments: &str,
        idempotency_key: &str,
    ) -> Result<String, McpError> {
        let max = config.max_output_bytes;
        let arguments = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(McpError::Arguments("not a JSON object".into())),
            Err(e) => return Err(McpError::Arguments(e.to_string())),
        };
        let server = self.server(config);
        let Ok(_slot) = server.slots.try_acquire() else {
            return Err(McpError::Busy(config.max_concurrent_calls));
        };
        let meta: RequestMetaObject =
            serde_json::from_value(json!({ "aptix/idempotency_key": idempotency_key }))
                .map_err(|e| McpError::Call(e.to_string()))?;
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.meta = Some(meta);
        let deadline = Instant::now() + Duration::from_millis(config.timeout_ms);
        let connection = server.connector.connect(deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let result = match tokio::time::timeout(left, connection.call_tool(params)).await {
            Err(_) => Err(McpError::Timeout(config.timeout_ms)),
            Ok(Err(e)) => Err(called(e, config, max)),
            Ok(Ok(result)) => Ok(result),
        };
        let result = result.inspect_err(|e| {
            if e.sent_without_answer() {
                server.connector.forget(&connection);
            }
        })?;
        let result = serde_json::to_value(result).map_err(|e| McpError::Call(e.to_string()))?;
        output::text(&result, max)
    }
}

/// What a failed `tools/call` means: the server answered with an error (it did not run the
/// tool), or the request was sent and no answer came back (it may have).
fn called(e: ServiceError, config: &McpServer, max: usize) -> McpError {
    match e {
        ServiceError::McpError(e) => McpError::Refused(output::clip(&e.message, max)),
        ServiceError::Timeout { .. } => McpError::Timeout(config.timeout_ms),
        other => {
            let text = output::without_url(
                &other.to_string(),
                config.url.as_ref().map(crate::config::ConnectionUrl::expose),
            );
            McpError::Call(output::clip(&text, max))
        }
    }
}

impl Server {
    fn new(config: &McpServer) -> Server {
        let slots = usize::try_from(config.max_concurrent_calls).unwrap_or(1);
        Server {
            config: config.clone(),
            connector: Connector::new(config),
            tools: Mutex::new(None),
            failed: Mutex::new(None),
            listing: Arc::new(tokio::sync::Mutex::new(())),
            slots: Semaphore::new(slots),
        }
    }

    /// The allowed tools as function tools, listed again once [`TOOLS_KEPT`] passed: in the
    /// background, the kept list served meanwhile (and while the server cannot be listed); a
    /// first listing is waited for [`FIRST_LISTING_WAIT`] at most.
    async fn tools(self: Arc<Self>) -> Result<Vec<Value>, McpError> {
        let kept = self.kept();
        if let Some((at, tools)) = &kept {
            if at.elapsed() < TOOLS_KEPT {
                return Ok(tools.clone());
            }
        }
        if let Some(e) = self.recent_failure() {
            return kept.map(|(_, tools)| tools).ok_or(e);
        }
        // One listing at a time: a turn that finds one running starts none of its own.
        if let Ok(one) = Arc::clone(&self.listing).try_lock_owned() {
            tokio::spawn(Arc::clone(&self).refresh(one));
        }
        if let Some((_, tools)) = kept {
            return Ok(tools);
        }
        // The first listing (this turn's or another's), waited for a while at most.
        let timeout_ms = self.config.timeout_ms;
        let wait = FIRST_LISTING_WAIT.min(Duration::from_millis(timeout_ms));
        if tokio::time::timeout(wait, self.listing.lock()).await.is_err() {
            let waited = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            tracing::info!(server = %self.config.name, waited_ms = waited, "mcp server still listing its tools; this turn goes on without them");
            return Err(McpError::Timeout(waited));
        }
        match self.kept() {
            Some((_, tools)) => Ok(tools),
            None => Err(self.recent_failure().unwrap_or(McpError::Timeout(timeout_ms))),
        }
    }

    fn kept(&self) -> Option<(Instant, Vec<Value>)> {
        self.tools.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Why listing failed, within [`LISTING_BACKOFF`] of it.
    fn recent_failure(&self) -> Option<McpError> {
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.as_ref().filter(|(at, _)| at.elapsed() < LISTING_BACKOFF).map(|(_, e)| e.clone())
    }

    /// Lists the server and keeps the list (or the failure), holding `_one` meanwhile; nothing
    /// when another listing kept a fresh list (or failed) since this one was asked for.
    async fn refresh(self: Arc<Self>, _one: tokio::sync::OwnedMutexGuard<()>) {
        let fresh = self.kept().is_some_and(|(at, _)| at.elapsed() < TOOLS_KEPT);
        if fresh || self.recent_failure().is_some() {
            return;
        }
        // A listing that panics (a bug a server's answer sets off) is a failed one: without
        // its backoff every turn would start another.
        let listed = async { self.list().await.map(|l| output::functions(&self.config, &l)) };
        let listed = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(listed))
            .await
            .unwrap_or_else(|_| Err(McpError::Call("listing the tools panicked".into())));
        match listed {
            Ok(tools) => {
                *self.tools.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), tools));
            }
            Err(e) => self.listing_failed(&e),
        }
    }

    fn listing_failed(&self, e: &McpError) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        if failed.as_ref().is_none_or(|(at, _)| at.elapsed() >= LISTING_BACKOFF) {
            tracing::warn!(
                server = %self.config.name, error = %e,
                "mcp server tools not offered: it could not be listed; asked again in 30 s"
            );
            *failed = Some((Instant::now(), e.clone()));
        }
    }

    /// `tools/list`, page by page (at most [`MAX_PAGES`]), within the server's timeout.
    async fn list(&self) -> Result<Vec<Value>, McpError> {
        let timeout_ms = self.config.timeout_ms;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let connection = self.connector.connect(deadline).await?;
        let pages = async {
            let mut tools = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_PAGES {
                let params = PaginatedRequestParams::default().with_cursor(cursor);
                let page = connection.list_tools(Some(params)).await;
                let page = page.map_err(|e| called(e, &self.config, 64 * 1024))?;
                let page = serde_json::to_value(page).map_err(|e| McpError::Call(e.to_string()))?;
                tools.extend(page["tools"].as_array().cloned().unwrap_or_default());
                cursor = page["nextCursor"].as_str().map(str::to_owned);
                if cursor.is_none() {
                    break;
                }
            }
            Ok(tools)
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let listed =
            tokio::time::timeout(left, pages).await.unwrap_or(Err(McpError::Timeout(timeout_ms)));
        if listed.as_ref().is_err_and(McpError::sent_without_answer) {
            self.connector.forget(&connection);
        }
        listed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that takes connections and never answers.
    async fn hanging() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        (listener, url)
    }

    #[tokio::test]
    async fn a_list_due_again_is_served_at_once_while_the_server_hangs() {
        let (_listener, url) = hanging().await;
        let config: McpServer = toml::from_str(&format!(
            "name = \"slow\"\nurl = \"{url}\"\nallowed_tools = [\"t\"]\ntimeout_ms = 60000"
        ))
        .unwrap();
        let server = Arc::new(Server::new(&config));
        let old = vec![json!({"name": "slow__t"})];
        let Some(stale) = Instant::now().checked_sub(TOOLS_KEPT * 2) else {
            eprintln!("skipped: the host's clock started less than 10 minutes ago");
            return;
        };
        *server.tools.lock().unwrap() = Some((stale, old.clone()));
        let started = Instant::now();
        let asked = (0..8).map(|_| Arc::clone(&server).tools());
        for listed in futures_util::future::join_all(asked).await {
            assert_eq!(listed.unwrap(), old);
        }
        assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
        // One listing runs meanwhile, not one per turn that asked.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(server.listing.try_lock().is_err(), "the listing goes on in the background");
    }
}
