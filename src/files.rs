//! `GET /files/<sha256>?owner=&expires=&sig=`: the files server tools produced (`write_file`),
//! served from PostgreSQL on each worker's HTTP listener (or its own, `files.listen`). A `FileRef`'s `Url` is a capability:
//! signed with the pipeline's keys over the owner (the tenant whose turn wrote it), the content
//! hash and the expiry, valid until its `ContentExpires`. The bare hash, an expired or altered
//! URL, or another tenant's file all get the same 404, so the store is no oracle of what exists.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{file_signature_valid, MessageKeys};
use crate::store::Store;

/// The route, for the listener that also serves `/metrics`. Without keys no URL verifies.
pub fn router(store: Store, keys: Option<MessageKeys>) -> axum::Router {
    axum::Router::new().route("/files/{sha256}", get(serve)).with_state(Files { store, keys })
}

#[derive(Clone)]
struct Files {
    store: Store,
    keys: Option<MessageKeys>,
}

const NOT_FOUND: &str = "no such file, or the link expired\n";

/// Binds `listen` (`files.listen`) and serves `files` (the [`router`]) alone there until
/// `shutdown`: no `/metrics` nor probes beside them.
pub async fn serve_alone(listen: String, files: Router, shutdown: CancellationToken) {
    match tokio::net::TcpListener::bind(listen.as_str()).await {
        Ok(listener) => serve_alone_on(listener, files, shutdown).await,
        Err(e) => warn!(%listen, error = %e, "cannot bind files.listen; not serving files"),
    }
}

/// [`serve_alone`] on a listener already bound.
pub async fn serve_alone_on(
    listener: tokio::net::TcpListener,
    files: Router,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving files");
    }
    let _ = crate::http::serve(listener, files, shutdown).await;
}

/// How often a worker process deletes expired files.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// Files one statement deletes at most (their contents are up to `files.max_bytes` each).
const SWEEP_BATCH: u32 = 200;

/// Deletes expired files (an hour after they expired, `FILE_GRACE`) every ten minutes, in
/// batches, until `shutdown`; every worker process that serves files runs it, and their
/// deletes pass over each other's rows.
pub async fn sweep(store: Store, shutdown: CancellationToken) {
    loop {
        loop {
            match store.delete_expired_files(SWEEP_BATCH).await {
                // A full batch: more may wait (the first sweep after an upgrade finds every file
                // ever written), deleted at a pace the database's WAL can follow.
                Ok(n) if n == u64::from(SWEEP_BATCH) && !shutdown.is_cancelled() => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Ok(_) => break,
                Err(error) => {
                    warn!(%error, "expired files not deleted; trying again later");
                    break;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Seconds a browser may keep a file: an hour, and never past its link's expiry (`expires`,
/// Unix seconds).
fn cache_for(expires: Option<i64>) -> i64 {
    let left = expires.map_or(0, |e| e - chrono::Utc::now().timestamp());
    left.clamp(0, 3600)
}

async fn serve(
    State(files): State<Files>,
    Path(sha256): Path<String>,
    Query(claim): Query<HashMap<String, String>>,
) -> Response {
    let valid =
        sha256.len() == 64 && sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let owner = claim.get("owner").map_or("", String::as_str);
    let expires = claim.get("expires").and_then(|e| e.parse::<i64>().ok());
    let signed = match (&files.keys, expires, claim.get("sig")) {
        (Some(keys), Some(exp), Some(sig)) => {
            exp > chrono::Utc::now().timestamp()
                && file_signature_valid(keys, owner, &sha256, exp, sig)
        }
        _ => false,
    };
    let signed = signed.then_some(owner);
    let Some(owner) = signed.filter(|_| valid) else {
        return (StatusCode::NOT_FOUND, NOT_FOUND).into_response();
    };
    match files.store.file(owner, &sha256).await {
        Ok(Some(content)) => (
            [
                // The bytes are the model's output: never rendered as a page of this origin.
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
                (header::ETAG, format!("\"{sha256}\"")),
                // Kept by a browser no longer than the link serves it.
                (
                    header::CACHE_CONTROL,
                    format!("private, max-age={}, immutable", cache_for(expires)),
                ),
            ],
            Body::from(content),
        )
            .into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, NOT_FOUND).into_response(),
        Err(error) => {
            warn!(%error, "could not read a stored file");
            (StatusCode::SERVICE_UNAVAILABLE, "the file store is unavailable\n").into_response()
        }
    }
}
