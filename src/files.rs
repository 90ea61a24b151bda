//! `GET /files/<sha256>`: the files server tools produced (`write_file`), served from
//! PostgreSQL on each worker's HTTP listener until they expire. The URL is the content's
//! SHA-256, so it names exactly the bytes a `FileRef`'s `ContentHash` promises.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::warn;

use crate::store::Store;

/// The route, for the listener that also serves `/metrics`.
pub fn router(store: Store) -> axum::Router {
    axum::Router::new().route("/files/{sha256}", get(serve)).with_state(store)
}

async fn serve(State(store): State<Store>, Path(sha256): Path<String>) -> Response {
    let valid =
        sha256.len() == 64 && sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    }
    match store.file(&sha256).await {
        Ok(Some(content)) => (
            [
                // The bytes are the model's output: never rendered as a page of this origin.
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
                (header::ETAG, format!("\"{sha256}\"")),
                (header::CACHE_CONTROL, "private, max-age=3600, immutable".to_owned()),
            ],
            Body::from(content),
        )
            .into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such file, or it expired\n").into_response(),
        Err(error) => {
            warn!(%error, "could not read a stored file");
            (StatusCode::SERVICE_UNAVAILABLE, "the file store is unavailable\n").into_response()
        }
    }
}
