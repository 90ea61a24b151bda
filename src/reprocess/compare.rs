//! Comparing a run's records with their originals: token usage, and where the outputs differ.
//!
//! A round trip "differs" when its kind changed (final, client tool continuation, error), or
//! for the same kind when the final `PrimaryOutputText` is not byte-for-byte equal, the tool
//! calls differ in name or arguments (call ids are the provider's and always differ), or the
//! error codes differ.

use serde::Serialize;
use serde_json::Value;

use crate::contracts::Usage;
use crate::store::EvalRow;

/// Most examples of differing outputs kept.
const EXAMPLES: usize = 5;

/// The run's records compared with their originals (selected turns only).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Comparison {
    /// Turns with records in the run.
    pub turns: usize,
    /// Round trips compared.
    pub round_trips: usize,
    /// Original round trips of those turns the run did not replay (the new answer took another
    /// path, or the original step never reached the model).
    pub round_trips_not_replayed: usize,
    /// Round trips with equal output.
    pub identical: usize,
    /// The kind changed.
    pub kind_changed: usize,
    /// Final answers with a different `PrimaryOutputText`.
    pub text_changed: usize,
    /// Tool calls with different names or arguments.
    pub tool_calls_changed: usize,
    /// Errors with different codes.
    pub errors_changed: usize,
    /// Token usage of the original round trips compared.
    pub original_usage: Usage,
    /// Token usage of the new ones.
    pub new_usage: Usage,
    /// A few differing round trips.
    pub examples: Vec<Difference>,
}

/// One differing round trip.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    /// Session.
    pub session_id: String,
    /// Turn.
    pub turn_id: String,
    /// Round trip.
    pub step: i32,
    /// What differs: `kind`, `text`, `tool_calls` or `errors`.
    pub what: &'static str,
    /// The original side (for text, the first differing line).
    pub original: String,
    /// The new side.
    pub new: String,
}

impl Comparison {
    /// Counts one pair of records (a comparison is built one pair at a time).
    pub fn add(&mut self, p: &EvalRow) {
        self.round_trips += 1;
        add_usage(&mut self.original_usage, p.original_usage.as_ref());
        add_usage(&mut self.new_usage, p.new_usage.as_ref());
        let Some(diff) = difference(p) else {
            self.identical += 1;
            return;
        };
        match diff.what {
            "kind" => self.kind_changed += 1,
            "text" => self.text_changed += 1,
            "tool_calls" => self.tool_calls_changed += 1,
            _ => self.errors_changed += 1,
        }
        if self.examples.len() < EXAMPLES {
            self.examples.push(diff);
        }
    }

    /// The comparison of the pairs added, of `turns` turns with `original_steps` original
    /// round trips.
    pub fn finish(mut self, turns: usize, original_steps: usize) -> Comparison {
        self.turns = turns;
        self.round_trips_not_replayed = original_steps.saturating_sub(self.round_trips);
        self
    }

    /// Round trips whose output differs.
    pub fn differing(&self) -> usize {
        self.kind_changed + self.text_changed + self.tool_calls_changed + self.errors_changed
    }
}

fn add_usage(total: &mut Usage, usage: Option<&Value>) {
    let Some(u) = usage.and_then(|v| serde_json::from_value::<Usage>(v.clone()).ok()) else {
        return;
    };
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.total_tokens += u.total_tokens;
    total.cached_input_tokens += u.cached_input_tokens;
    total.reasoning_tokens += u.reasoning_tokens;
}

/// How a pair differs, if it does.
fn difference(p: &EvalRow) -> Option<Difference> {
    let (what, original, new) = if p.original_kind != p.new_kind {
        ("kind", p.original_kind.clone(), p.new_kind.clone())
    } else {
        match p.new_kind.as_str() {
            "final" => {
                let text = |r: &Value| {
                    r["Result"]["PrimaryOutputText"].as_str().unwrap_or_default().to_owned()
                };
                let (a, b) = (text(&p.original_reply), text(&p.new_reply));
                if a == b {
                    return None;
                }
                let (a, b) = first_differing_line(&a, &b);
                ("text", a, b)
            }
            "client_tool_continuation" => {
                let calls = |r: &Value| {
                    let calls = r["Result"]["ToolCalls"].as_array().cloned().unwrap_or_default();
                    let shown: Vec<String> = calls
                        .iter()
                        .map(|c| {
                            format!(
                                "{}({})",
                                c["Name"].as_str().unwrap_or("?"),
                                c["ArgumentsJson"].as_str().unwrap_or("")
                            )
                        })
                        .collect();
                    shown.join(", ")
                };
                let (a, b) = (calls(&p.original_reply), calls(&p.new_reply));
                if a == b {
                    return None;
                }
                ("tool_calls", a, b)
            }
            _ => {
                let codes = |r: &Value| {
                    let errors = r["Errors"].as_array().cloned().unwrap_or_default();
                    errors
                        .iter()
                        .filter_map(|e| e["Code"].as_str().map(str::to_owned))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let (a, b) = (codes(&p.original_reply), codes(&p.new_reply));
                if a == b {
                    return None;
                }
                ("errors", a, b)
            }
        }
    };
    Some(Difference {
        session_id: p.session_id.to_string(),
        turn_id: p.turn_id.clone(),
        step: p.step,
        what,
        original: clip(&original),
        new: clip(&new),
    })
}

/// The first line where two texts differ, numbered (`line 7: …`).
fn first_differing_line(a: &str, b: &str) -> (String, String) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => {
                let show =
                    |l: Option<&str>| l.map_or_else(|| "(no line)".to_owned(), str::to_owned);
                return (format!("line {n}: {}", show(x)), format!("line {n}: {}", show(y)));
            }
        }
    }
    (String::new(), String::new())
}

fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX {
        return s.to_owned();
    }
    format!("{}…", s.chars().take(MAX).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pair(kind: (&str, &str), replies: (Value, Value)) -> EvalRow {
        EvalRow {
            original_id: uuid::Uuid::nil(),
            new_id: uuid::Uuid::nil(),
            original_chunks: None,
            original_model: None,
            instruction: None,
            new_chunks: None,
            new_model: None,
            new_tools: None,
            new_timings: None,
            session_id: uuid::Uuid::nil(),
            turn_id: "t1".into(),
            step: 0,
            original_kind: kind.0.into(),
            original_reply: replies.0,
            original_usage: Some(
                json!({"InputTokens": 100, "OutputTokens": 10, "TotalTokens": 110, "CachedInputTokens": 0, "ReasoningTokens": 0}),
            ),
            new_kind: kind.1.into(),
            new_reply: replies.1,
            new_usage: Some(
                json!({"InputTokens": 80, "OutputTokens": 10, "TotalTokens": 90, "CachedInputTokens": 0, "ReasoningTokens": 0}),
            ),
        }
    }

    fn text(t: &str) -> Value {
        json!({"Successful": true, "Result": {"Kind": "final", "PrimaryOutputText": t}})
    }

    #[test]
    fn classifies_differences_and_sums_usage() {
        let pairs = [
            pair(("final", "final"), (text("a\nb"), text("a\nb"))),
            pair(("final", "final"), (text("a\nb\nc"), text("a\nB\nc"))),
            pair(("final", "client_tool_continuation"), (text("a"), json!({}))),
        ];
        let mut c = Comparison::default();
        pairs.iter().for_each(|p| c.add(p));
        let c = c.finish(3, 4);
        assert_eq!(
            (c.identical, c.text_changed, c.kind_changed, c.round_trips_not_replayed),
            (1, 1, 1, 1)
        );
        assert_eq!(c.examples[0].original, "line 2: b");
        assert_eq!(c.examples[0].new, "line 2: B");
        assert_eq!((c.original_usage.total_tokens, c.new_usage.total_tokens), (330, 270));
    }

    #[test]
    fn a_shorter_text_differs_at_its_end() {
        assert_eq!(
            first_differing_line("a\nb", "a"),
            ("line 2: b".into(), "line 2: (no line)".into())
        );
    }
}
