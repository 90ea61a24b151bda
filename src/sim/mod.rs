//! A simulator of the OpenAI Responses API subset Aptix uses, for tests, benchmarks and the
//! offline demo: `aptix sim --listen 127.0.0.1:PORT`, or in-process with [`start`] and the
//! returned [`SimHandle`].
//!
//! It serves `POST /v1/responses` (JSON, or SSE with the real event sequence) and
//! `GET /v1/responses/{id}`; stores responses so `previous_response_id` chains work (an unknown
//! id gets the real 400 `previous_response_not_found`); validates each body as the live API
//! does for the DESIGN.md §5 rules; answers deterministically, steered by directives in the
//! instruction (see the `script` module and the README); and injects latency and faults on demand.

mod cache;
mod control;
mod directives;
mod errors;
mod faults;
mod request_rules;
mod response;
mod script;
mod server;
mod sse;
mod state;
mod validate_input;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use control::Control;
pub use faults::{Fault, FaultPlan, Latency};
pub use state::{LoggedRequest, SimStats};

use state::SimState;

/// How to run a simulator.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Initial latency (changeable later).
    pub latency: Latency,
    /// When set, requests must carry `Authorization: Bearer <key>` (else 401).
    pub api_key: Option<String>,
    /// Request bodies kept in the log (the oldest are dropped); 0 keeps none.
    pub log_capacity: usize,
    /// Responses kept for `previous_response_id` (the oldest are evicted, as after expiry).
    pub store_capacity: usize,
    /// Characters per streamed text or argument delta.
    pub delta_chars: usize,
    /// How long a hung request or stalled stream stays silent before giving up.
    pub hang_limit: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: Latency::default(),
            api_key: None,
            log_capacity: 1000,
            store_capacity: 50_000,
            delta_chars: 16,
            hang_limit: Duration::from_secs(300),
        }
    }
}

/// A running simulator. Dropping it shuts the server down.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    state: Arc<SimState>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Starts a simulator on the current tokio runtime.
pub async fn start(config: SimConfig) -> std::io::Result<SimHandle> {
    use axum::serve::ListenerExt as _;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = watch::channel(false);
    let state = Arc::new(SimState::new(&config, rx));
    let app = server::router(state.clone());
    let listener = listener.tap_io(|tcp| {
        // Small SSE frames and JSON bodies must not wait for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
    });
    let closed = state.clone();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { closed.closed().await })
            .await
    });
    tracing::info!(%addr, "responses simulator listening");
    Ok(SimHandle { addr, state, shutdown: tx, task: Some(task) })
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to configure as `llm.base_url`: `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The fault plan, to arm or clear faults.
    pub fn faults(&self) -> &FaultPlan {
        &self.state.faults
    }

    /// Replaces the latency settings.
    pub fn set_latency(&self, latency: Latency) {
        self.state.latency.set(latency);
    }

    /// Forgets every stored response.
    pub fn forget_stored_responses(&self) {
        self.state.forget_all();
    }

    /// Applies a control command.
    pub fn control(&self, command: Control) {
        command.apply(&self.state);
    }

    /// The logged request bodies, oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.state.logged()
    }

    /// The logged request bodies parsed as JSON (bodies that are not JSON are skipped).
    pub fn request_bodies(&self) -> Vec<serde_json::Value> {
        self.state.logged().iter().filter_map(LoggedRequest::json).collect()
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        self.state.stats()
    }

    /// Stops accepting, ends hung requests and stalled streams, and waits for the server task
    /// (at most two seconds).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
