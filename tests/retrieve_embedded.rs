//! Indexing and retrieval end to end on the embedded Qdrant Edge store, over a fixture tree:
//! every RagScope operator, repo restriction, top-k / budget / dedup, idempotent re-indexing and
//! reopening the shard (Edge does not replay its WAL, so this also checks the flushes).

use crate::retrieve_support;

use retrieve_support as s;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scope_operator_filters_as_documented() {
    s::every_scope_operator_filters_as_documented("test", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_ranked_exact_and_bounded() {
    s::results_are_ranked_exact_and_bounded("test", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reindexing_is_idempotent_and_removes_stale_chunks() {
    s::reindexing_is_idempotent_and_removes_stale_chunks("test", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_shard_has_every_write() {
    s::a_reopened_shard_has_every_write("test", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selecting_from_scores_chooses_what_every_payload_would() {
    s::selecting_from_scores_chooses_what_every_payload_would("test", None).await;
}
