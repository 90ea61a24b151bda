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
    by_score(&mut hits, |c| c.score);
    let mut selection = Selection::new(top_k, budget_chars);
    for chunk in hits {
        if selection.offer(chunk) {
            break;
        }
    }
    selection.into_chunks()
}

/// Sorts best score first, keeping the order of ties (a missing score ranks last).
pub(crate) fn by_score<T>(items: &mut [T], score: impl Fn(&T) -> Option<f32>) {
    items.sort_by(|a, b| {
        let (sa, sb) = (score(a).unwrap_or(f32::MIN), score(b).unwrap_or(f32::MIN));
        sb.total_cmp(&sa)
    });
}

/// [`select`] one chunk at a time, in score order: lets a store read the texts of only the
/// candidates it offers instead of every hit's.
#[derive(Debug)]
pub(crate) struct Selection {
    top_k: usize,
    budget_chars: usize,
    used: usize,
    seen: HashSet<String>,
    out: Vec<Chunk>,
}

impl Selection {
    /// An empty selection of at most `top_k` chunks within `budget_chars` characters.
    pub fn new(top_k: usize, budget_chars: usize) -> Self {
        // top_k comes from configuration; the capacity must not trust it to be small.
        let out = Vec::with_capacity(top_k.min(64));
        Selection { top_k, budget_chars, used: 0, seen: HashSet::new(), out }
    }

    /// Chunks still wanted.
    pub fn wanted(&self) -> usize {
        self.top_k.saturating_sub(self.out.len())
    }

    /// Takes `chunk` (the next best) if it is new and fits; returns whether the selection is full.
    pub fn offer(&mut self, chunk: Chunk) -> bool {
        if self.wanted() == 0 {
            return true;
        }
        if self.seen.insert(chunk.id.clone()) {
            let len = chunk.text.chars().count();
            if self.used + len <= self.budget_chars {
                self.used += len;
                self.out.push(chunk);
            }
        }
        self.wanted() == 0
    }

    /// The chunks taken, best first.
    pub fn into_chunks(self) -> Vec<Chunk> {
        self.out
    }
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
