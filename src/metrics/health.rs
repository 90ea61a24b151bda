//! The process's HTTP face for monitors: `/metrics` (the registry, in the Prometheus text
//! format), `/healthz` and `/readyz`, which also keeps `aptix_dependency_up` current at each
//! scrape.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::metrics;

/// A dependency `/readyz` checks (the database), without metrics knowing what it is.
pub trait Ready: Send + Sync {
    /// Whether it answers now.
    fn ready(&self) -> futures_util::future::BoxFuture<'_, bool>;
}

#[derive(Clone)]
struct HealthState {
    database: Option<Arc<dyn Ready>>,
}

/// Serves `/metrics`, `/healthz` and `/readyz` (and the routes of `extra`) on `listen` until
/// `shutdown`. A port already in use is logged and skipped: metrics must never stop a worker.
pub async fn serve(
    listen: String,
    database: Option<Arc<dyn Ready>>,
    extra: Option<axum::Router>,
    shutdown: CancellationToken,
) {
    let addr: SocketAddr = match listen.parse() {
        Ok(a) => a,
        Err(e) => {
            return warn!(%listen, error = %e, "metrics address is invalid; not serving metrics")
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            return warn!(%addr, error = %e, "cannot bind the metrics port; not serving metrics")
        }
    };
    serve_on(listener, database, extra, shutdown).await;
}

/// [`serve`] on a listener already bound (one bound to port 0 keeps the port it was given, so
/// no other server can take it between choosing and binding).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    database: Option<Arc<dyn Ready>>,
    extra: Option<axum::Router>,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving metrics and health");
    }
    let app = axum::Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Arc::new(HealthState { database }))
        .merge(extra.unwrap_or_default());
    let _ = crate::http::serve(listener, app, shutdown).await;
}

/// Whether the broker and the database answer now, also kept as `aptix_dependency_up` so an
/// alert sees what `/readyz` sees.
async fn probe(state: &HealthState) -> (bool, bool) {
    let broker = metrics().broker_connections.load(Ordering::Relaxed) > 0;
    let database = match &state.database {
        Some(db) => db.ready().await,
        None => true,
    };
    metrics().set_up("broker", broker);
    if state.database.is_some() {
        metrics().set_up("database", database);
    }
    (broker, database)
}

async fn scrape(State(state): State<Arc<HealthState>>) -> impl IntoResponse {
    probe(&state).await;
    let text = "text/plain; version=0.0.4; charset=utf-8";
    ([(axum::http::header::CONTENT_TYPE, text)], metrics().encode())
}

async fn ready(State(state): State<Arc<HealthState>>) -> impl IntoResponse {
    let (broker, database) = probe(&state).await;
    let status = if broker && database { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut text = format!("broker: {}\ndatabase: {}\n", up(broker), up(database));
    if let Some(problem) = metrics().broker_problem_now().filter(|_| !broker) {
        text.push_str(&format!("broker problem: {problem}\n"));
    }
    (status, text)
}

fn up(ok: bool) -> &'static str {
    if ok {
        "up"
    } else {
        "down"
    }
}
