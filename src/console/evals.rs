//! The console's evaluation pages (`aptix eval`, issue 45): the runs kept in `eval_runs`, and one
//! run's arms side by side — a chart per scorer (mean and 95 % interval per arm), the paired
//! comparisons with the baseline, and the worst regressions linked to their turns. Evaluations
//! replay every tenant's turns, so a tenant's operator is not shown them.

use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use maud::html;

use super::charts::interval_bars;
use super::pages::layout;
use super::{everyone, failed, not_found, Console, Page, Scope};
use crate::eval::EvalReport;

/// `/evals`.
pub(super) async fn list(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
) -> Page {
    everyone(&scope)?;
    let runs = c.store.eval_runs(200).await.map_err(failed)?;
    Ok(layout(
        "Evaluations",
        html! {
            table {
                tr { th { "run" } th { "arms" } th { "last run (UTC)" } }
                @for (run, report, at) in &runs {
                    tr {
                        td { a href=(format!("/evals/{run}")) { (run) } }
                        td { (report["arms"].as_array().map_or(0, Vec::len)) }
                        td { (at.to_rfc3339()) }
                    }
                }
            }
            p.note { "Run with `aptix eval --arm NAME[:model=M][:context=C] …`; each arm is a reprocess run `<run>.<arm>`." }
        },
    ))
}

/// `/evals/<run>`.
pub(super) async fn page(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Path(run): Path<String>,
) -> Page {
    everyone(&scope)?;
    let json = c.store.eval_run(&run).await.map_err(failed)?;
    let json = json.ok_or_else(|| not_found("no such evaluation"))?;
    let report: EvalReport = serde_json::from_value(json).map_err(failed)?;
    let mut scorers: Vec<&String> = report.arms.iter().flat_map(|a| a.scores.keys()).collect();
    scorers.sort();
    scorers.dedup();
    Ok(layout(
        &format!("Evaluation {run}"),
        html! {
            p { "Baseline " strong { (report.baseline) } "; regressions by " strong { (report.primary) } "." }
            @if report.interrupted { p.notice { "Interrupted: what ran before the stop, judged no further." } }
            @for a in report.arms.iter().filter(|a| a.turns_not_run > 0) {
                p.note { (a.name) ": " (a.turns_not_run) " turns not run, left out of the comparison." }
            }
            @for name in &scorers {
                @let bars: Vec<(String, f64, f64, f64)> = report.arms.iter().filter_map(|a| {
                    a.scores.get(*name).map(|e| (a.name.clone(), e.mean, e.low, e.high))
                }).collect();
                (interval_bars(name, &bars))
            }
            h2 { "Against the baseline" }
            table.paired {
                tr { th { "arm" } th { "scorer" } th { "difference" } th { "95 % interval" } th { "better" } th { "worse" } th { "p (sign test)" } }
                @for a in &report.arms {
                    @for (name, p) in &a.versus_baseline {
                        tr {
                            td { (a.name) } td { (name) }
                            td { (format!("{:+.4}", p.difference.mean)) }
                            td { (format!("{:+.4} to {:+.4}", p.difference.low, p.difference.high)) }
                            td { (p.better) } td { (p.worse) } td { (format!("{:.4}", p.p_value)) }
                        }
                    }
                }
            }
            h2 { "Worst regressions" }
            table.regressions {
                tr { th { "arm" } th { "turn" } th { "step" } th { "baseline" } th { "arm" } th { "records" } }
                @for r in &report.regressions {
                    tr {
                        td { (r.arm) }
                        td { a href=(r.page) { (r.session_id) " " (r.turn_id) } }
                        td { (r.step) } td { (r.baseline_score) } td { (r.arm_score) }
                        td { (r.baseline_record) " → " (r.arm_record) }
                    }
                }
            }
        },
    ))
}
