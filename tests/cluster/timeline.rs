//! What happened when in a node-loss run, in wall-clock UTC as well as relative to the kill, so
//! a failed run can be read against the pipeline's log lines and the nodes' own logs (both carry
//! UTC times). CI keeps only part of a failed test's output: this report is what explains it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Marks of the run: rounds published, kill, restart.
#[derive(Default)]
pub struct Timeline {
    marks: Vec<(Instant, chrono::DateTime<chrono::Utc>, String)>,
}

impl Timeline {
    /// Notes `what` now, and returns the instant.
    pub fn mark(&mut self, what: impl Into<String>) -> Instant {
        let at = Instant::now();
        self.marks.push((at, chrono::Utc::now(), what.into()));
        at
    }

    /// Notes `what` at `at`, an instant in the past (the wall time is derived from it).
    pub fn mark_at(&mut self, at: Instant, what: impl Into<String>) {
        self.marks.push((at, wall(at), what.into()));
    }

    /// The marks, then final replies per second from 2 s before the kill: an empty second is a
    /// second the pipeline answered nothing.
    pub fn report(&self, killed_at: Instant, finals: &[Instant]) -> String {
        let offset = |at: Instant| -> f64 {
            if at >= killed_at {
                (at - killed_at).as_secs_f64()
            } else {
                -(killed_at - at).as_secs_f64()
            }
        };
        let mut marks = self.marks.clone();
        marks.sort_by_key(|(at, _, _)| *at);
        let mut out = String::from("timeline (seconds from the kill):\n");
        for (at, wall, what) in &marks {
            let wall = wall.format("%H:%M:%S%.3f");
            out.push_str(&format!("  {:+8.2}  {wall}Z  {what}\n", offset(*at)));
        }
        let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
        for at in finals.iter().filter(|at| offset(**at) >= -2.0) {
            *per_second.entry(offset(*at).floor() as i64).or_default() += 1;
        }
        let last = per_second.keys().next_back().copied().unwrap_or(0);
        out.push_str("final replies per second from the kill:\n ");
        for second in -2..=last {
            out.push_str(&format!(" {second}:{}", per_second.get(&second).unwrap_or(&0)));
        }
        out.push('\n');
        out
    }
}

/// The wall-clock time of `at`, an instant in the past.
pub fn wall(at: Instant) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() - chrono::Duration::from_std(at.elapsed()).unwrap_or_default()
}

/// The longest silence between two final replies after `killed_at` (within `window` of it),
/// and where it began.
pub fn longest_silence(
    finals: &[Instant],
    killed_at: Instant,
    window: Duration,
) -> (Duration, Instant) {
    let mut all = finals.to_vec();
    all.sort();
    let (mut gap, mut from) = (Duration::ZERO, killed_at);
    for w in all.windows(2) {
        if w[1] > killed_at && w[0] <= killed_at + window {
            let start = w[0].max(killed_at);
            if w[1] - start > gap {
                (gap, from) = (w[1] - start, start);
            }
        }
    }
    (gap, from)
}

/// The lines of the nodes' logs since `since` about leaders, elections and nodes going down or
/// up (at most `limit` per node): what RabbitMQ itself did meanwhile. The nodes log in UTC.
pub fn node_log_excerpt(
    cluster_dir: &Path,
    since: chrono::DateTime<chrono::Utc>,
    limit: usize,
) -> String {
    let since = since.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
    let wanted = ["leader", "election", "down", "node ", "timeout", "error"];
    let mut out = String::new();
    for node in 1..=3 {
        let path = cluster_dir.join(format!("n{node}/log/aptix-n{node}@localhost.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.get(..since.len()).is_some_and(|t| t >= since.as_str()))
            .filter(|l| wanted.iter().any(|w| l.contains(w)))
            .collect();
        let skip = lines.len().saturating_sub(limit);
        out.push_str(&format!(
            "--- n{node}: {} lines since the kill, last {limit}:\n",
            lines.len()
        ));
        for line in &lines[skip..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
