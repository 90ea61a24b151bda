//! The shipped retrieval evaluation (`eval/tokio.jsonl` over the tokio crate of the local cargo
//! registry, which every build of this project downloads) stays above a quality floor.

use aptix::cli::eval_retrieval::registry_crate;
use aptix::index::{index_repository, IndexOptions};
use aptix::retrieve::eval::{evaluate, parse_queries};
use aptix::retrieve::Retrieval;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_query_set_keeps_its_recall_and_mrr() {
    let root = env!("CARGO_MANIFEST_DIR");
    let queries =
        parse_queries(&std::fs::read_to_string(format!("{root}/eval/tokio.jsonl")).unwrap())
            .unwrap();
    assert!(queries.len() >= 30);
    let source = registry_crate("tokio")
        .expect("tokio is a dependency, so its source is in the cargo registry");
    let data = tempfile::tempdir().unwrap();
    let mut settings = aptix::config::Settings::load(None).unwrap();
    settings.vector.url = None;
    settings.vector.embeddings_url = None;
    settings.vector.data_dir = data.path().to_path_buf();
    let retrieval = Retrieval::from_settings(&settings).unwrap();
    let mut opts = IndexOptions::new(&source, "tokio");
    opts.progress = false;
    let summary = index_repository(&retrieval, "eval", &opts).await.unwrap();
    assert!(summary.files >= 300, "corpus too small: {summary}");
    let report = evaluate(&retrieval, "eval", &queries, 10).await.unwrap();
    // README figures: recall@10 0.938, MRR@10 0.817, hit@10 1.000 (tokio 1.54.1).
    assert!(report.recall_at_k >= 0.85, "recall@10 {:.3}", report.recall_at_k);
    assert!(report.mrr >= 0.70, "MRR@10 {:.3}", report.mrr);
    assert!(report.hit_rate >= 0.95, "hit@10 {:.3}", report.hit_rate);
}
