//! The same scenarios as `retrieve_embedded.rs` against a Qdrant server over gRPC. Runs only when
//! `QDRANT_URL` is set (e.g. `http://127.0.0.1:6334`, with `QDRANT_API_KEY` if needed); CI has no
//! server, so there each test returns at once. Every run uses fresh collections.

use crate::retrieve_support;

use retrieve_support as s;

fn server() -> Option<(String, Option<String>)> {
    let url = std::env::var("QDRANT_URL").ok().filter(|u| !u.is_empty());
    if url.is_none() {
        eprintln!("QDRANT_URL is not set: server backend not tested");
    }
    url.map(|u| (format!("aptix-test-{}", uuid::Uuid::new_v4()), Some(u)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_scope_operators() {
    if let Some((c, url)) = server() {
        s::every_scope_operator_filters_as_documented(&c, url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_ranking_and_bounds() {
    if let Some((c, url)) = server() {
        s::results_are_ranked_exact_and_bounded(&c, url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_reindexing() {
    if let Some((c, url)) = server() {
        s::reindexing_is_idempotent_and_removes_stale_chunks(&c, url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_reconnect() {
    if let Some((c, url)) = server() {
        s::a_reopened_shard_has_every_write(&c, url).await;
    }
}
