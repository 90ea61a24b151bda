//! Figures of one run, their median and range over runs, targets, the printed table and JSON.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

/// One measured figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Stable key (JSON).
    pub key: String,
    /// What it is, for the table.
    pub label: String,
    /// Unit.
    pub unit: &'static str,
    /// Value.
    pub value: f64,
}

/// Figures of one run, plus details only written to JSON.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// Figures, in print order.
    pub figures: Vec<Figure>,
    /// Everything else worth keeping (sizes, queue depths, CPU use).
    pub details: BTreeMap<String, Value>,
    /// Turns that ended without a successful final reply (failed, or no reply in time).
    pub failures: usize,
}

impl RunReport {
    /// Adds a figure.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        label: impl Into<String>,
        unit: &'static str,
        value: f64,
    ) {
        self.figures.push(Figure { key: key.into(), label: label.into(), unit, value });
    }

    /// Adds a JSON detail.
    pub fn detail(&mut self, key: &str, value: impl Serialize) {
        self.details.insert(key.to_owned(), serde_json::to_value(value).unwrap_or(Value::Null));
    }
}

/// A target on a figure's median.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// At least.
    AtLeast(&'static str, f64),
    /// At most.
    AtMost(&'static str, f64),
    /// Below.
    Below(&'static str, f64),
}

impl Target {
    fn key(&self) -> &'static str {
        match self {
            Target::AtLeast(k, _) | Target::AtMost(k, _) | Target::Below(k, _) => k,
        }
    }

    fn met(&self, v: f64) -> bool {
        match *self {
            Target::AtLeast(_, t) => v >= t,
            Target::AtMost(_, t) => v <= t,
            Target::Below(_, t) => v < t,
        }
    }

    fn text(&self) -> String {
        match *self {
            Target::AtLeast(_, t) => format!(">= {}", fmt(t)),
            Target::AtMost(_, t) => format!("<= {}", fmt(t)),
            Target::Below(_, t) => format!("< {}", fmt(t)),
        }
    }
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Median, min and max of a figure over runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What it is.
    pub label: String,
    /// Unit.
    pub unit: &'static str,
    /// Median over runs (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Every run's value.
    pub values: Vec<f64>,
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Summaries by key, in the first run's order.
pub fn summarize(runs: &[RunReport]) -> Vec<(String, Summary)> {
    let mut out: Vec<(String, Summary)> = Vec::new();
    for f in runs.iter().flat_map(|r| r.figures.iter()) {
        if out.iter().any(|(k, _)| *k == f.key) {
            continue;
        }
        let values: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.figures.iter().find(|g| g.key == f.key).map(|g| g.value))
            .collect();
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let summary = Summary {
            label: f.label.clone(),
            unit: f.unit,
            median: median(&sorted),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            values,
        };
        out.push((f.key.clone(), summary));
    }
    out
}

/// Prints the table and returns the benchmark's JSON.
pub fn finish(
    name: &str,
    params: Value,
    runs: &[RunReport],
    targets: &[Target],
    notes: &[String],
) -> Value {
    let summary = summarize(runs);
    println!();
    println!("== aptix-bench {name}: {} run(s)", runs.len());
    println!(
        "{:<46} {:>10} {:>10} {:>10} {:<8} {:>9} {:>4}",
        "figure", "median", "min", "max", "unit", "target", "met"
    );
    let mut target_json = Vec::new();
    for (key, s) in &summary {
        let target = targets.iter().find(|t| t.key() == key);
        let (t, met) = match target {
            Some(t) => {
                let met = t.met(s.median);
                target_json.push(
                    json!({"figure": key, "target": t.text(), "median": s.median, "met": met}),
                );
                (t.text(), if met { "yes" } else { "NO" })
            }
            None => (String::new(), ""),
        };
        println!(
            "{:<46} {:>10} {:>10} {:>10} {:<8} {:>9} {:>4}",
            s.label,
            fmt(s.median),
            fmt(s.min),
            fmt(s.max),
            s.unit,
            t,
            met
        );
    }
    let failures: usize = runs.iter().map(|r| r.failures).sum();
    if failures > 0 {
        println!("turns without a successful final reply: {failures}");
    }
    for n in notes {
        println!("note: {n}");
    }
    json!({
        "benchmark": name,
        "params": params,
        "runs": runs.iter().map(|r| json!({
            "figures": r.figures.iter().map(|f| (f.key.clone(), json!(f.value))).collect::<serde_json::Map<_, _>>(),
            "failures": r.failures,
            "details": r.details,
        })).collect::<Vec<_>>(),
        "summary": summary.iter().map(|(k, s)| (k.clone(), json!(s))).collect::<serde_json::Map<_, _>>(),
        "targets": target_json,
        "failures": failures,
        "notes": notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        let mut runs = Vec::new();
        for v in [3.0, 1.0, 2.0] {
            let mut r = RunReport::default();
            r.add("x", "x", "u", v);
            runs.push(r);
        }
        let s = summarize(&runs);
        assert_eq!((s[0].1.median, s[0].1.min, s[0].1.max), (2.0, 1.0, 3.0));
        assert!(Target::AtLeast("x", 2.0).met(2.0));
        assert!(!Target::Below("x", 2.0).met(2.0));
    }
}
