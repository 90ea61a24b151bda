//! A server's connection: opened once at a time (waiters share the attempt), within the caller's
//! deadline, not tried again for a moment after it failed, dropped when a call found it broken,
//! and for a `url` server replaced after a while. A `command` server is a child process that gets no environment of the worker's (its
//! keys and URLs) beyond what a program needs to start.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt as _};

use super::output::{self, McpError};
use crate::config::McpServer;

/// An open session with a server.
pub(super) type Connection = RunningService<RoleClient, ()>;

/// After a failed attempt, how long callers are told at once that the server is unreachable.
const CONNECT_BACKOFF: Duration = Duration::from_secs(5);
/// How long a `url` server's connection is used for new calls before another is opened. The
/// transport keeps what the server sends it for the connection's life (the tool headers of
/// every listing), and reopens its event stream as soon as the server asks: a fresh connection
/// now and then bounds both. A `command` server keeps its process.
const HTTP_CONNECTION_AGE: Duration = Duration::from_secs(600);

/// Variables a `command` server inherits from the worker; nothing else of its environment.
const CHILD_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

pub(super) struct Connector {
    config: McpServer,
    /// The connection and when it was opened.
    open: Mutex<Option<(Instant, Arc<Connection>)>>,
    /// Held while a connection is being opened: one attempt at a time.
    opening: tokio::sync::Mutex<()>,
    /// When the last attempt failed, and why.
    down: Mutex<Option<(Instant, String)>>,
}

impl Connector {
    pub(super) fn new(config: &McpServer) -> Connector {
        Connector {
            config: config.clone(),
            open: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            down: Mutex::new(None),
        }
    }

    fn live(&self) -> Option<Arc<Connection>> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let young = |at: &Instant| self.config.url.is_none() || at.elapsed() < HTTP_CONNECTION_AGE;
        open.as_ref().filter(|(at, c)| young(at) && !c.is_closed()).map(|(_, c)| c.clone())
    }

    /// The open connection, or a new one, by `deadline`.
    pub(super) async fn connect(&self, deadline: Instant) -> Result<Arc<Connection>, McpError> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let ms = self.config.timeout_ms;
        let late = || McpError::Connect(format!("no connection within {ms} ms"));
        let left = deadline.saturating_duration_since(Instant::now());
        let _opening = tokio::time::timeout(left, self.opening.lock()).await.map_err(|_| late())?;
        // Another caller may have opened it, or failed to, while this one waited.
        if let Some(c) = self.live() {
            return Ok(c);
        }
        if let Some((at, why)) = self.down.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            if at.elapsed() < CONNECT_BACKOFF {
                return Err(McpError::Connect(why));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let opened = tokio::time::timeout(left, self.open()).await.unwrap_or_else(|_| Err(late()));
        match opened {
            Ok(c) => {
                let c = Arc::new(c);
                *self.open.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), c.clone()));
                *self.down.lock().unwrap_or_else(PoisonError::into_inner) = None;
                Ok(c)
            }
            Err(e) => {
                let why = e.to_string();
                *self.down.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), why));
                Err(e)
            }
        }
    }

    /// Drops `broken`, so that the next call connects again.
    pub(super) fn forget(&self, broken: &Arc<Connection>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.as_ref().is_some_and(|(_, c)| Arc::ptr_eq(c, broken)) {
            *open = None;
        }
    }

    async fn open(&self) -> Result<Connection, McpError> {
        let c = &self.config;
        let failed = |e: &dyn std::fmt::Display| {
            let text = output::without_url(
                &e.to_string(),
                c.url.as_ref().map(crate::config::ConnectionUrl::expose),
            );
            McpError::Connect(output::clip(&text, 1024))
        };
        if let Some(url) = &c.url {
            // Room for the output cap and the JSON-RPC envelope around it; more is cut off at
            // the transport, not buffered.
            let limit = c.max_output_bytes.saturating_mul(2).saturating_add(64 * 1024);
            let headers = output::headers(&c.headers).map_err(|e| failed(&e))?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.expose())
                .custom_headers(headers)
                .max_json_response_size(limit)
                .max_sse_event_size(limit)
                // A call the server answers "session expired" (404) may have run: sent again on
                // a new session, a tool with effects would run twice. It fails as any broken
                // call does (outcome unknown), and the next call connects afresh.
                .reinit_on_expired_session(false);
            if let Some(file) = &c.token_file {
                // Read at each connection: a rotated token is used from the next one on.
                let token = std::fs::read_to_string(file).map_err(|e| failed(&e))?;
                config = config.auth_header(token.trim().to_owned());
            }
            let http = crate::http::client().build().map_err(|e| failed(&e))?;
            let transport = StreamableHttpClientTransport::with_client(http, config);
            ().serve(transport).await.map_err(|e| failed(&e))
        } else {
            let (program, args) = c.command.split_first().ok_or_else(|| failed(&"no command"))?;
            let mut command = tokio::process::Command::new(program);
            command.args(args).env_clear().kill_on_drop(true).stderr(std::process::Stdio::null());
            for key in CHILD_ENV {
                if let Some(value) = std::env::var_os(key) {
                    command.env(key, value);
                }
            }
            let transport = TokioChildProcess::new(command).map_err(|e| failed(&e))?;
            ().serve(transport).await.map_err(|e| failed(&e))
        }
    }
}
