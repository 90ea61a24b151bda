//! Retrieval quality: recall@k and MRR of a query set with known relevant files.
//!
//! Query lines (JSONL; blank lines and lines starting with `#` are skipped):
//! `{"query": "...", "repo": "...", "expected_paths": ["src/a.rs", ...]}`.
//! - recall@k: the share of a query's expected files that appear among its top-k chunks, averaged;
//! - MRR: the mean of 1 / rank of the first chunk from an expected file (0 when none in top-k);
//! - hit rate: the share of queries with at least one expected file in the top-k.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{Retrieval, RetrieveError, SearchRequest};

/// One evaluation query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalQuery {
    /// The query text.
    pub query: String,
    /// Repository restriction, as a request's `Repo`.
    #[serde(default)]
    pub repo: Option<String>,
    /// Files whose chunks answer the query.
    pub expected_paths: Vec<String>,
}

/// The outcome of one query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryResult {
    /// The query text.
    pub query: String,
    /// 1-based rank of the first chunk from an expected file, if within k.
    pub first_hit: Option<usize>,
    /// Share of expected files found within k.
    pub recall: f64,
    /// Paths of the returned chunks, best first.
    pub returned: Vec<String>,
}

/// Aggregate figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// Cut-off.
    pub k: usize,
    /// Number of queries.
    pub queries: usize,
    /// Mean recall@k.
    pub recall_at_k: f64,
    /// Mean reciprocal rank (within k).
    pub mrr: f64,
    /// Share of queries with a hit within k.
    pub hit_rate: f64,
    /// Per-query outcomes.
    pub results: Vec<QueryResult>,
}

/// Parses a JSONL query set; errors name the line.
pub fn parse_queries(text: &str) -> Result<Vec<EvalQuery>, BadQuery> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let line = i + 1;
            let q: EvalQuery =
                serde_json::from_str(l).map_err(|e| BadQuery::Json { line, source: e })?;
            if q.expected_paths.is_empty() {
                return Err(BadQuery::NoExpectedPaths { line });
            }
            Ok(q)
        })
        .collect()
}

/// A line of a query set that is not a query.
#[derive(Debug, thiserror::Error)]
pub enum BadQuery {
    /// Not a query's JSON.
    #[error("line {line}: {source}")]
    Json {
        /// 1-based.
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
    /// A query that could never be scored.
    #[error("line {line}: expected_paths is empty")]
    NoExpectedPaths {
        /// 1-based.
        line: usize,
    },
}

/// Scores one query's returned paths against its expected paths.
pub fn score(query: &EvalQuery, returned: Vec<String>) -> QueryResult {
    let expected: HashSet<&str> = query.expected_paths.iter().map(String::as_str).collect();
    let first_hit = returned.iter().position(|p| expected.contains(p.as_str())).map(|i| i + 1);
    let found: HashSet<&str> =
        returned.iter().map(String::as_str).filter(|p| expected.contains(p)).collect();
    let recall = found.len() as f64 / expected.len() as f64;
    QueryResult { query: query.query.clone(), first_hit, recall, returned }
}

/// Runs every query against `collection` with top-k = `k` and no character budget.
pub async fn evaluate(
    retrieval: &Retrieval,
    collection: &str,
    queries: &[EvalQuery],
    k: usize,
) -> Result<EvalReport, RetrieveError> {
    let mut results = Vec::with_capacity(queries.len());
    for q in queries {
        let outcome = retrieval
            .search(SearchRequest {
                collection,
                query_text: &q.query,
                repo: q.repo.as_deref(),
                scope: &[],
                top_k: k,
                budget_chars: usize::MAX,
            })
            .await?;
        results.push(score(q, outcome.chunks.into_iter().map(|c| c.path).collect()));
    }
    let n = results.len().max(1) as f64;
    Ok(EvalReport {
        k,
        queries: results.len(),
        recall_at_k: results.iter().map(|r| r.recall).sum::<f64>() / n,
        mrr: results.iter().map(|r| r.first_hit.map_or(0.0, |h| 1.0 / h as f64)).sum::<f64>() / n,
        hit_rate: results.iter().filter(|r| r.first_hit.is_some()).count() as f64 / n,
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoring_counts_ranks_and_recall() {
        let q = EvalQuery {
            query: "x".into(),
            repo: None,
            expected_paths: vec!["a".into(), "b".into()],
        };
        let r = score(&q, vec!["c".into(), "b".into(), "b".into()]);
        assert_eq!(r.first_hit, Some(2));
        assert!((r.recall - 0.5).abs() < 1e-9);
        assert_eq!(score(&q, vec![]).first_hit, None);
    }

    #[test]
    fn parsing_skips_comments_and_names_bad_lines() {
        let ok = parse_queries("# c\n\n{\"query\":\"q\",\"expected_paths\":[\"a\"]}\n").unwrap();
        assert_eq!(ok.len(), 1);
        let err = parse_queries("{\"query\":\"q\",\"expected_paths\":[]}").unwrap_err();
        assert!(err.to_string().starts_with("line 1"), "{err}");
    }
}
