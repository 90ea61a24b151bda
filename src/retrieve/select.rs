//! From raw hits to the chunks a turn gets: best score first, one copy per chunk id, at most
//! top-k, within the character budget. Overlapping spans of one file stay separate chunks
//! (AGN-002: do not merge).

use std::collections::HashSet;

use crate::chunk::Chunk;

/// How many hits to ask the store for: spares for duplicates and for chunks that do not fit.
pub fn fetch_limit(top_k: usize) -> usize {
    (top_k * 3).max(top_k + 16)
}

/// Orders by score (stable for ties), drops repeated chunk ids, and fills greedily: a chunk that
/// would overflow the budget is skipped and smaller lower-ranked chunks may still fit, so one
/// huge chunk cannot empty the context.
pub fn select(mut hits: Vec<Chunk>, top_k: usize, budget_chars: usize) -> Vec<Chunk> {
    hits.sort_by(|a, b| {
        let (sa, sb) = (a.score.unwrap_or(f32::MIN), b.score.unwrap_or(f32::MIN));
        sb.total_cmp(&sa)
    });
    let mut seen = HashSet::new();
    let mut used = 0usize;
    let mut out = Vec::with_capacity(top_k.min(hits.len()));
    for chunk in hits {
        if out.len() == top_k {
            break;
        }
        if !seen.insert(chunk.id.clone()) {
            continue;
        }
        let len = chunk.text.chars().count();
        if used + len > budget_chars {
            continue;
        }
        used += len;
        out.push(chunk);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: &str, lines: (u32, u32), len: usize, score: f32) -> Chunk {
        Chunk {
            id: id.into(),
            path: "src/a.rs".into(),
            start_line: lines.0,
            end_line: lines.1,
            language: "rust".into(),
            text: "x".repeat(len),
            repo: None,
            score: Some(score),
        }
    }

    #[test]
    fn orders_dedups_and_keeps_overlaps_separate() {
        let hits = vec![
            chunk("b", (5, 20), 10, 0.5),
            chunk("a", (1, 10), 10, 0.9),
            chunk("a", (1, 10), 10, 0.9),
        ];
        let out = select(hits, 8, 1000);
        let ids: Vec<_> = out.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(out[0].end_line >= out[1].start_line, "overlapping spans stay separate");
    }

    #[test]
    fn top_k_and_budget_bound_the_result() {
        let hits = (0..10)
            .map(|i| chunk(&i.to_string(), (i, i), 100, 10.0 - i as f32))
            .collect::<Vec<_>>();
        assert_eq!(select(hits.clone(), 3, 10_000).len(), 3);
        assert_eq!(select(hits.clone(), 10, 250).len(), 2);
        let mut big_first = hits;
        big_first.push(chunk("big", (1, 400), 5_000, 99.0));
        let out = select(big_first, 2, 250);
        assert_eq!(
            out.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["0", "1"],
            "oversized chunk skipped"
        );
        assert!(out.iter().map(|c| c.text.len()).sum::<usize>() <= 250);
    }
}
