//! The closing report: what this invocation did with each selected turn, and how the run's
//! records (this invocation's and those of earlier, interrupted ones) compare with the
//! originals (see `compare`).

use crate::contracts::ids::printable;
use std::fmt;

use serde::Serialize;

use super::compare::Comparison;

/// Most turn problems listed.
const PROBLEMS: usize = 10;

/// What became of the selected turns, and how the outputs compare.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The run id (`reprocess_run`).
    pub run: String,
    /// Turns selected.
    pub selected: usize,
    /// Turns reprocessed by this invocation.
    pub done: usize,
    /// Turns skipped because the run had already reprocessed them.
    pub already_done: usize,
    /// Turns skipped because they cannot be run again (see `problems`).
    pub unavailable: usize,
    /// Turns that failed this time; running the same run again retries them.
    pub failed: usize,
    /// Turns not started: `--limit` reached or interrupted.
    pub left: usize,
    /// Of the failed turns, those whose request the provider refused (the model or the
    /// request): an evaluation counts them against the arm, unlike turns never started or whose
    /// provider was down, slow or refused the account.
    #[serde(skip)]
    pub unanswered: std::collections::BTreeSet<(uuid::Uuid, String)>,
    /// Whether the invocation was interrupted.
    pub interrupted: bool,
    /// The first failed or skipped turns, with the reason.
    pub problems: Vec<Problem>,
    /// The run's records against the originals.
    pub comparison: Comparison,
}

/// A turn that was not reprocessed.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// Session.
    pub session_id: String,
    /// Turn.
    pub turn_id: String,
    /// `failed` or `skipped`.
    pub outcome: &'static str,
    /// Why.
    pub reason: String,
}

impl Report {
    /// Notes a turn that was not reprocessed (the first few are kept).
    pub(crate) fn problem(
        &mut self,
        session_id: String,
        turn_id: String,
        outcome: &'static str,
        reason: String,
    ) {
        if self.problems.len() < PROBLEMS {
            self.problems.push(Problem { session_id, turn_id, outcome, reason });
        }
    }
}

/// `before → after (+x.y%)`.
fn change(before: u64, after: u64) -> String {
    if before == 0 {
        return format!("{before} → {after}");
    }
    let pct = (after as f64 - before as f64) * 100.0 / before as f64;
    format!("{before} → {after} ({pct:+.1}%)")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "reprocess run {}: {} turns selected{}",
            self.run,
            self.selected,
            if self.interrupted { " (interrupted)" } else { "" }
        )?;
        writeln!(
            f,
            "  turns: {} done, {} skipped ({} already done in this run, {} not reprocessable), {} failed, {} left",
            self.done,
            self.already_done + self.unavailable,
            self.already_done,
            self.unavailable,
            self.failed,
            self.left
        )?;
        let c = &self.comparison;
        writeln!(
            f,
            "  outputs (the run so far: {} turns, {} round trips): {} identical, {} differ ({} kind, {} text, {} tool calls, {} errors); {} original round trips not replayed",
            c.turns, c.round_trips, c.identical, c.differing(), c.kind_changed, c.text_changed, c.tool_calls_changed, c.errors_changed, c.round_trips_not_replayed
        )?;
        let (o, n) = (&c.original_usage, &c.new_usage);
        writeln!(
            f,
            "  tokens: input {}, output {}, total {}, cached input {}, reasoning {}",
            change(o.input_tokens, n.input_tokens),
            change(o.output_tokens, n.output_tokens),
            change(o.total_tokens, n.total_tokens),
            change(o.cached_input_tokens, n.cached_input_tokens),
            change(o.reasoning_tokens, n.reasoning_tokens)
        )?;
        if !c.examples.is_empty() {
            writeln!(f, "  differences (first {}):", c.examples.len())?;
            for d in &c.examples {
                // Stored and replayed answers are a tenant's text (it can echo an instruction
                // holding ESC): shown escaped, they cannot rewrite the operator's terminal.
                writeln!(
                    f,
                    "    {} {} step {} [{}]\n      was: {}\n      now: {}",
                    d.session_id,
                    printable(&d.turn_id),
                    d.step,
                    d.what,
                    printable(&d.original),
                    printable(&d.new)
                )?;
            }
        }
        if !self.problems.is_empty() {
            writeln!(f, "  not reprocessed (first {}):", self.problems.len())?;
            for p in &self.problems {
                let (turn, reason) = (printable(&p.turn_id), printable(&p.reason));
                writeln!(f, "    {} {turn}: {}: {reason}", p.session_id, p.outcome)?;
            }
        }
        if self.failed > 0 || self.left > 0 {
            writeln!(
                f,
                "  run `aptix reprocess --run {}` with the same selection to finish",
                self.run
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_counts_changes_and_how_to_finish() {
        assert_eq!(change(330, 270), "330 → 270 (-18.2%)");
        assert_eq!(change(0, 12), "0 → 12");
        let report = Report {
            run: "r".into(),
            selected: 3,
            done: 1,
            failed: 1,
            left: 1,
            ..Report::default()
        };
        let shown = report.to_string();
        assert!(shown.contains("1 done, 0 skipped"), "{shown}");
        assert!(shown.contains("run `aptix reprocess --run r`"), "{shown}");
    }

    #[test]
    fn stored_text_is_shown_escaped() {
        let mut report = Report { run: "r".into(), ..Report::default() };
        report.comparison.examples.push(super::super::compare::Difference {
            session_id: "s".into(),
            turn_id: "t".into(),
            step: 0,
            what: "text",
            original: "\u{1b}]52;c;aGk=\u{7}was".into(),
            new: "now\u{202e}".into(),
        });
        report.problems.push(Problem {
            session_id: "s".into(),
            turn_id: "t\u{1b}[2J".into(),
            outcome: "failed",
            reason: "boom\u{1b}[8m".into(),
        });
        let shown = report.to_string();
        assert!(!shown.contains('\u{1b}') && !shown.contains('\u{202e}'), "{shown:?}");
        assert!(shown.contains("\\u{1b}]52;c;aGk=\\u{7}was"), "{shown}");
    }
}
