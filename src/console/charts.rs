//! Charts the console draws on the server as inline SVG (no script, no outside resource; the
//! page's CSP allows neither): a turn's waterfall (queue wait and work per stage, per step) and
//! spend per tenant per day as stacked bars. maud escapes every label, as in the pages.

use maud::{html, Markup};

/// Width of the plotting area, in SVG units (the SVG scales to the page).
const WIDTH: f64 = 900.0;
/// Left margin for the row labels.
const LABEL: f64 = 150.0;
/// Height of one waterfall row.
const ROW: f64 = 22.0;
/// Colours of the series, in order (repeated past the last).
const COLOURS: [&str; 6] = ["#3b6fb6", "#d9822b", "#2e8b57", "#a23b72", "#6c757d", "#b8860b"];

/// One row of a waterfall: a stage of a step, waiting in its queue from `wait_from` (when known)
/// until `start`, then working until `end`, in milliseconds from the turn's first instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// `step 0: retrieve`.
    pub label: String,
    /// Start of the queue wait, when the previous stage's hand-on is known.
    pub wait_from: Option<f64>,
    /// The stage received the message.
    pub start: f64,
    /// The stage handed its output on.
    pub end: f64,
}

/// The waterfall of `spans`: one row each, a light bar for the wait and a dark one for the work,
/// with a millisecond axis.
pub fn waterfall(spans: &[Span]) -> Markup {
    let total = spans.iter().map(|s| s.end).fold(1.0_f64, f64::max);
    let x = |ms: f64| LABEL + (ms.max(0.0) / total) * (WIDTH - LABEL - 10.0);
    let height = ROW * spans.len() as f64 + 30.0;
    html! {
        svg.waterfall xmlns="http://www.w3.org/2000/svg" role="img" width="100%"
            viewBox=(format!("0 0 {WIDTH} {height}")) {
            title { "Waterfall: queue wait (light) and work (dark) per stage, per step" }
            @for (i, s) in spans.iter().enumerate() {
                @let y = ROW * i as f64;
                text x="4" y=(y + 15.0) font-size="12" { (s.label) }
                @if let Some(from) = s.wait_from {
                    rect.wait x=(x(from)) y=(y + 4.0) width=(bar(x(from), x(s.start)))
                        height=(ROW - 8.0) fill="#c9d6ea" {
                        title { (format!("{}: waited {:.0} ms", s.label, s.start - from)) }
                    }
                }
                rect.work x=(x(s.start)) y=(y + 4.0) width=(bar(x(s.start), x(s.end)))
                    height=(ROW - 8.0) fill=(COLOURS[0]) {
                    title { (format!("{}: {:.0} ms", s.label, s.end - s.start)) }
                }
            }
            @let axis = ROW * spans.len() as f64 + 14.0;
            line x1=(LABEL) x2=(WIDTH - 10.0) y1=(axis - 10.0) y2=(axis - 10.0) stroke="#99a" {}
            @for tick in ticks(total) {
                text x=(x(tick)) y=(axis + 6.0) font-size="11" text-anchor="middle" { (format!("{tick:.0} ms")) }
            }
        }
    }
}

/// A bar's width from its two ends, at least a visible sliver.
fn bar(from: f64, to: f64) -> f64 {
    (to - from).max(1.0)
}

/// Four or five round ticks from 0 to `total`.
fn ticks(total: f64) -> Vec<f64> {
    let raw = total / 4.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw);
    (0..=4).map(|i| i as f64 * step).filter(|t| *t <= total * 1.001).collect()
}

/// Spend per series (tenants) per day, stacked: `days` are the x axis in order, `series` each
/// a name and its value per day (micro-dollars), aligned with `days`.
pub fn stacked_days(days: &[String], series: &[(String, Vec<u64>)]) -> Markup {
    let height = 260.0;
    let plot = height - 40.0;
    let totals: Vec<u64> = (0..days.len())
        .map(|d| series.iter().map(|(_, v)| v.get(d).copied().unwrap_or(0)).sum())
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0).max(1) as f64;
    let slot = (WIDTH - LABEL) / days.len().max(1) as f64;
    let y = |micros: f64| plot - micros / max * (plot - 10.0);
    // Each day's series stacked from the axis up: (x, y, width, height, colour, tooltip).
    let mut bars = Vec::new();
    for (d, day) in days.iter().enumerate() {
        let mut base = 0u64;
        for (i, (name, values)) in series.iter().enumerate() {
            let v = values.get(d).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            let (top, bottom) = (y((base + v) as f64), y(base as f64));
            let tip = format!("{name} on {day}: ${:.6}", v as f64 / 1e6);
            let left = LABEL + slot * d as f64 + 2.0;
            let colour = COLOURS[i % COLOURS.len()];
            bars.push((left, top, (slot - 4.0).max(1.0), (bottom - top).max(1.0), colour, tip));
            base += v;
        }
    }
    html! {
        svg.spend xmlns="http://www.w3.org/2000/svg" role="img" width="100%"
            viewBox=(format!("0 0 {} {}", WIDTH + 24.0, height + 20.0 * series.len().div_ceil(4) as f64)) {
            title { "Spend per tenant per UTC day (settled and reserved), stacked" }
            text x="4" y="16" font-size="12" { (format!("${:.4}", max / 1e6)) }
            text x="4" y=(plot) font-size="12" { "$0" }
            line x1=(LABEL) x2=(WIDTH) y1=(plot) y2=(plot) stroke="#99a" {}
            @for r in &bars {
                rect.day x=(r.0) y=(r.1) width=(r.2) height=(r.3) fill=(r.4) { title { (r.5) } }
            }
            @for (d, day) in days.iter().enumerate() {
                @if d % (days.len() / 8).max(1) == 0 {
                    text x=(LABEL + slot * (d as f64 + 0.5)) y=(plot + 16.0) font-size="11" text-anchor="middle" { (day.get(5..).unwrap_or(day)) }
                }
            }
            @for (i, (name, _)) in series.iter().enumerate() {
                @let (lx, ly) = (LABEL + 200.0 * (i % 4) as f64, height + 20.0 * (i / 4) as f64 - 4.0);
                rect x=(lx) y=(ly - 10.0) width="12" height="12" fill=(COLOURS[i % COLOURS.len()]) {}
                text x=(lx + 18.0) y=(ly) font-size="12" { (name) }
            }
        }
    }
}

/// One bar per arm with its 95 % interval as a whisker: `values` are (arm, mean, low, high).
pub fn interval_bars(title: &str, values: &[(String, f64, f64, f64)]) -> Markup {
    let (height, plot) = (180.0, 140.0);
    let top = values.iter().map(|v| v.3.max(v.1)).fold(0.0_f64, f64::max);
    let top = if top > 0.0 { top } else { 1.0 };
    let y = |v: f64| plot - (v.max(0.0) / top) * (plot - 10.0);
    let slot = (WIDTH - LABEL) / values.len().max(1) as f64;
    html! {
        svg.arms xmlns="http://www.w3.org/2000/svg" role="img" width="100%"
            viewBox=(format!("0 0 {WIDTH} {height}")) {
            title { (title) }
            text x="4" y="16" font-size="13" font-weight="bold" { (title) }
            text x="4" y="34" font-size="11" { (format!("{top:.4}")) }
            text x="4" y=(plot) font-size="11" { "0" }
            line x1=(LABEL) x2=(WIDTH) y1=(plot) y2=(plot) stroke="#99a" {}
            @for (i, (arm, mean, low, high)) in values.iter().enumerate() {
                @let (left, width) = (LABEL + slot * i as f64 + slot * 0.2, slot * 0.6);
                rect.arm x=(left) y=(y(*mean)) width=(width) height=((plot - y(*mean)).max(1.0))
                    fill=(COLOURS[i % COLOURS.len()]) {
                    title { (format!("{arm}: {mean:.4} (95 % interval {low:.4} to {high:.4})")) }
                }
                line x1=(left + width / 2.0) x2=(left + width / 2.0) y1=(y(*low)) y2=(y(*high)) stroke="#1d2430" stroke-width="2" {}
                text x=(left + width / 2.0) y=(plot + 16.0) font-size="12" text-anchor="middle" { (arm) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waterfall_has_a_bar_per_stage_and_a_wait_where_known() {
        let spans = [
            Span { label: "step 0: retrieve".into(), wait_from: None, start: 0.0, end: 40.0 },
            Span {
                label: "step 0: invoke <b>".into(),
                wait_from: Some(40.0),
                start: 45.0,
                end: 400.0,
            },
        ];
        let svg = waterfall(&spans).into_string();
        assert_eq!(svg.matches("<rect class=\"work\"").count(), 2);
        assert_eq!(svg.matches("<rect class=\"wait\"").count(), 1);
        assert!(svg.contains("step 0: invoke &lt;b&gt;: 355 ms"), "labels are escaped: {svg}");
        assert!(svg.contains(">400 ms<"), "the axis reaches the end: {svg}");
    }

    #[test]
    fn stacked_days_stack_each_days_series() {
        let days = vec!["2026-11-28".to_owned(), "2026-11-29".to_owned()];
        let series = vec![
            ("ta".to_owned(), vec![1_000_000, 0]),
            ("tb".to_owned(), vec![3_000_000, 2_000_000]),
        ];
        let svg = stacked_days(&days, &series).into_string();
        assert_eq!(svg.matches("<rect class=\"day\"").count(), 3, "no bar for a zero: {svg}");
        assert!(svg.contains("tb on 2026-11-28: $3.000000"), "{svg}");
        assert!(svg.contains(">$4.0000<"), "the scale is the largest day's total: {svg}");
    }

    #[test]
    fn interval_bars_draw_a_bar_and_a_whisker_per_arm() {
        let arms = vec![("original".to_owned(), 1.0, 1.0, 1.0), ("mini".to_owned(), 0.5, 0.1, 0.9)];
        let svg = interval_bars("exact", &arms).into_string();
        assert_eq!(svg.matches("<rect class=\"arm\"").count(), 2);
        assert!(svg.contains("mini: 0.5000 (95 % interval 0.1000 to 0.9000)"), "{svg}");
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(400.0), vec![0.0, 100.0, 200.0, 300.0, 400.0]);
        assert_eq!(ticks(37.0), vec![0.0, 10.0, 20.0, 30.0]);
    }
}
