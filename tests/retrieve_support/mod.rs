//! Shared fixture and scenarios for the retrieval tests, run against the embedded store
//! (`retrieve_embedded.rs`) and, when `QDRANT_URL` is set, a Qdrant server (`retrieve_server.rs`).

#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use aptix::config::{ConnectionUrl, Settings};
use aptix::contracts::ScopeCondition;
use aptix::index::{index_repository, IndexOptions, IndexSummary};
use aptix::retrieve::filter::{FilterSpec, SCOPE_KEY_IGNORED};
use aptix::retrieve::{Retrieval, SearchOutcome, SearchRequest};

pub fn write(root: &Path, rel: &str, contents: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

pub fn fixture(root: &Path) {
    write(root, ".gitignore", "dist/\n");
    write(root, "dist/bundle.js", "function quaternionSlerp() {}\n");
    write(
        root,
        "src/ui/primitives/Button.tsx",
        "export function Button(props: ButtonProps) {\n  return quaternionButton(props);\n}\n",
    );
    write(
        root,
        "src/ui/layout/Grid.tsx",
        "export function Grid() {\n  return quaternionGrid();\n}\n",
    );
    write(
        root,
        "src/core/quaternion.rs",
        "/// Quaternion maths.\npub fn quaternion_multiply(a: Quat, b: Quat) -> Quat {\n    a * b\n}\n",
    );
    write(root, "docs/quaternion.md", "# Quaternions\n\nHow quaternion rotation works.\n");
    write(root, "tests/quaternion_test.rs", "#[test]\nfn quaternion_identity() {}\n");
}

/// Default settings with the embedded store under `data_dir` (or the server at `url`).
pub fn settings(data_dir: &Path, url: Option<String>) -> Settings {
    let mut s = Settings::load(None).unwrap();
    s.vector.url = url.map(ConnectionUrl::new);
    s.vector.embeddings_url = None;
    s.vector.data_dir = data_dir.to_path_buf();
    s
}

pub async fn index(r: &Retrieval, c: &str, root: &Path, repo: &str) -> IndexSummary {
    let mut opts = IndexOptions::new(root, repo);
    opts.progress = false;
    index_repository(r, c, &opts).await.unwrap()
}

pub fn scope(json: serde_json::Value) -> Vec<ScopeCondition> {
    serde_json::from_value(json).unwrap()
}

pub async fn search(
    r: &Retrieval,
    c: &str,
    query: &str,
    repo: Option<&str>,
    scope: &[ScopeCondition],
) -> SearchOutcome {
    let req = SearchRequest {
        collection: c,
        query_text: query,
        repo,
        scope,
        top_k: 50,
        budget_chars: 100_000,
    };
    r.search(req).await.unwrap()
}

pub fn paths(o: &SearchOutcome) -> Vec<String> {
    let mut p: Vec<String> = o.chunks.iter().map(|c| c.path.clone()).collect();
    p.sort();
    p.dedup();
    p
}

pub async fn every_scope_operator_filters_as_documented(c: &str, url: Option<String>) {
    let (src, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fixture(src.path());
    let r = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
    let summary = index(&r, c, src.path(), "acme/web").await;
    assert_eq!(summary.files, 5, "{summary}");
    index(&r, c, src.path(), "acme/other").await;

    let all = search(&r, c, "quaternion", Some("acme/web"), &[]).await;
    assert_eq!(paths(&all).len(), 5, "gitignored dist/ is not indexed: {:?}", paths(&all));
    assert!(all.chunks.iter().all(|c| c.repo.as_deref() == Some("acme/web")));
    let both = search(&r, c, "quaternion", None, &[]).await;
    assert_eq!(both.chunks.len(), 10, "without Repo both repositories match");

    let eq = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "language", "operator": "==", "values": ["TypeScript", "markdown"]}])),
    )
    .await;
    assert_eq!(
        paths(&eq),
        ["docs/quaternion.md", "src/ui/layout/Grid.tsx", "src/ui/primitives/Button.tsx"]
    );

    let ne = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "Path", "operator": "!=", "values": ["docs/quaternion.md", "tests/quaternion_test.rs"]}])),
    )
    .await;
    assert_eq!(
        paths(&ne),
        ["src/core/quaternion.rs", "src/ui/layout/Grid.tsx", "src/ui/primitives/Button.tsx"]
    );

    let contains = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "path", "operator": "contains", "values": ["ui/primitives"]}])),
    )
    .await;
    assert_eq!(paths(&contains), ["src/ui/primitives/Button.tsx"]);
    let stem = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "path", "operator": "contains", "values": ["src", ".RS"]}])),
    )
    .await;
    assert_eq!(
        paths(&stem),
        ["src/core/quaternion.rs"],
        "every value must match; case-insensitive"
    );

    let not = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "path", "operator": "does_not_contain", "values": ["src/ui", "tests"]}])),
    )
    .await;
    assert_eq!(paths(&not), ["docs/quaternion.md", "src/core/quaternion.rs"]);

    let unknown = search(
        &r,
        c,
        "quaternion",
        Some("acme/web"),
        &scope(serde_json::json!([
        {"key": "team", "operator": "==", "values": ["x"]}])),
    )
    .await;
    assert_eq!(paths(&unknown).len(), 5, "an unmappable key restricts nothing");
    assert_eq!(unknown.warnings.len(), 1);
    assert_eq!(unknown.warnings[0].code, SCOPE_KEY_IGNORED);
}

pub async fn results_are_ranked_exact_and_bounded(c: &str, url: Option<String>) {
    let (src, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fixture(src.path());
    let r = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
    index(&r, c, src.path(), "acme/web").await;

    let best = search(&r, c, "quaternion multiply Quat", None, &[]).await;
    assert_eq!(best.chunks[0].path, "src/core/quaternion.rs");
    let scores: Vec<f32> = best.chunks.iter().map(|c| c.score.unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "ordered by score: {scores:?}");
    let ids: std::collections::HashSet<_> = best.chunks.iter().map(|c| &c.id).collect();
    assert_eq!(ids.len(), best.chunks.len(), "no duplicate chunk ids");
    for c in &best.chunks {
        let file = std::fs::read_to_string(src.path().join(&c.path)).unwrap();
        let lines: Vec<&str> = file.lines().collect();
        assert_eq!(
            c.text,
            lines[c.start_line as usize - 1..c.end_line as usize].join("\n"),
            "exact span of {}",
            c.path
        );
    }

    let req = |top_k, budget_chars| SearchRequest {
        collection: c,
        query_text: "quaternion",
        repo: None,
        scope: &[],
        top_k,
        budget_chars,
    };
    assert_eq!(r.search(req(2, 100_000)).await.unwrap().chunks.len(), 2);
    let budget = 100;
    let small = r.search(req(10, budget)).await.unwrap();
    assert!(!small.chunks.is_empty());
    assert!(small.chunks.iter().map(|c| c.text.chars().count()).sum::<usize>() <= budget);
    assert!(r.search(req(10, 0)).await.unwrap().chunks.is_empty());
}

pub async fn reindexing_is_idempotent_and_removes_stale_chunks(c: &str, url: Option<String>) {
    let (src, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fixture(src.path());
    let r = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
    let first = index(&r, c, src.path(), "acme/web").await;
    assert_eq!((first.written, first.unchanged, first.deleted), (first.chunks, 0, 0));

    let again = index(&r, c, src.path(), "acme/web").await;
    assert_eq!(
        (again.written, again.unchanged, again.deleted),
        (0, first.chunks, 0),
        "nothing rewritten"
    );

    write(
        src.path(),
        "src/ui/layout/Grid.tsx",
        "export function Grid() {\n  return quaternionGridV2();\n}\n",
    );
    std::fs::remove_file(src.path().join("docs/quaternion.md")).unwrap();
    let changed = index(&r, c, src.path(), "acme/web").await;
    assert_eq!(
        (changed.written, changed.deleted, changed.unchanged),
        (1, 2, first.chunks - 2),
        "{changed}"
    );
    let found = search(&r, c, "quaternion quaternionGridV2", None, &[]).await;
    assert!(!paths(&found).contains(&"docs/quaternion.md".to_owned()));
    let grid: Vec<_> = found.chunks.iter().filter(|c| c.path == "src/ui/layout/Grid.tsx").collect();
    assert_eq!(grid.len(), 1);
    assert!(grid[0].text.contains("V2"));
}

pub async fn a_reopened_shard_has_every_write(c: &str, url: Option<String>) {
    let (src, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fixture(src.path());
    let chunks = {
        let r = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
        let summary = index(&r, c, src.path(), "acme/web").await;
        // A second handle for the same directory shares the open shard instead of failing on its lock.
        let again = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
        assert_eq!(
            again.store(c).await.unwrap().count(FilterSpec::default()).await.unwrap(),
            summary.chunks
        );
        summary.chunks
    };
    let r = Retrieval::from_settings(&settings(data.path(), url.clone())).unwrap();
    let store = r.store(c).await.unwrap();
    assert_eq!(store.count(FilterSpec::default()).await.unwrap(), chunks);
    assert_eq!(paths(&search(&r, c, "quaternion", Some("acme/web"), &[]).await).len(), 5);
    let again = index(&r, c, src.path(), "acme/web").await;
    assert_eq!(again.unchanged, chunks, "ids survive a reopen");
}

/// What a store selects itself (`query_selected`, which in the embedded store reads payloads a
/// batch at a time) is exactly what selecting from every hit with its payload gives: the same
/// chunks, texts and scores, in the same order, whatever top-k and budget skip or stop at. At
/// least one pair must reach past the first `top_k` hits, or the later batches go untested.
pub async fn selecting_from_scores_chooses_what_every_payload_would(c: &str, url: Option<String>) {
    use aptix::retrieve::select::{fetch_limit, select};
    use aptix::retrieve::StoreQuery;
    let (src, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for i in 0..40usize {
        // Files of different lengths and keyword counts: scores differ, some chunks are large.
        let body = "let filler = 1;\n".repeat(1 + (i * 7) % 60);
        let hits = "quaternion rotation\n".repeat(1 + i % 5);
        write(src.path(), &format!("src/q{i:02}.rs"), &format!("// file {i}\n{hits}{body}"));
    }
    let r = Retrieval::from_settings(&settings(data.path(), url)).unwrap();
    index(&r, c, src.path(), "acme/many").await;
    let store = r.store(c).await.unwrap();
    let combos = [(1, 100_000), (3, 250), (8, 600), (8, 100_000), (20, 2_000), (60, 100_000)];
    let mut past_first_batch = false;
    for (top_k, budget) in combos {
        let query = StoreQuery {
            sparse: r.encoder().query("quaternion rotation filler"),
            dense: None,
            filter: FilterSpec::default(),
            limit: fetch_limit(top_k),
        };
        let every = store.query(query.clone()).await.unwrap();
        let found = every.len();
        assert!(found > top_k.min(39), "enough hits to choose from: {found} for top-k {top_k}");
        let ranks: Vec<String> = every.iter().map(|h| h.id.clone()).collect();
        let want = select(every, top_k, budget);
        let deepest = want.iter().filter_map(|w| ranks.iter().position(|id| *id == w.id)).max();
        past_first_batch |= deepest.is_some_and(|d| d >= top_k);
        let got = store.query_selected(query, top_k, budget).await.unwrap();
        assert!(!want.is_empty(), "top-k {top_k}, budget {budget} selects something");
        assert_eq!(got.chunks, want, "top-k {top_k}, budget {budget}");
        assert_eq!(got.found, found);
    }
    assert!(past_first_batch, "some budget skips a hit, so a later batch is read");
}
