//! The console's budgets page (docs/tenancy.md §7a): every money budget with what is spent and
//! reserved of it this UTC day and month, and spend per tenant per day over the last 31 days as
//! a chart. A tenant's operator sees its own tenant's budget and spend only.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Extension, State};
use maud::html;

use super::charts::stacked_days;
use super::pages::layout;
use super::{failed, Console, Page, Scope};
use crate::budgets::BudgetUse;
use crate::config::Usd;

/// Days the chart covers, today included.
const DAYS: i32 = 31;

/// `/budgets`.
pub(super) async fn page(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
) -> Page {
    let tenant = scope.tenant();
    let mut budgets = crate::budgets::read(&c.settings, &c.store).await.map_err(failed)?;
    // Context budgets count every tenant's turns: not a tenant operator's to see.
    budgets.retain(|b| tenant.is_none_or(|t| b.scope == "tenant" && b.name == t));
    let rows = c.store.daily_spend(tenant, DAYS).await.map_err(failed)?;
    let today = chrono::Utc::now().date_naive();
    let days: Vec<chrono::NaiveDate> =
        (0..DAYS).rev().map(|back| today - chrono::Days::new(back as u64)).collect();
    let mut series: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (name, day, micros) in rows {
        let values = series.entry(name).or_insert_with(|| vec![0; days.len()]);
        if let Some(i) = days.iter().position(|d| *d == day) {
            values[i] = u64::try_from(micros).unwrap_or(0);
        }
    }
    let labels: Vec<String> = days.iter().map(ToString::to_string).collect();
    let series: Vec<(String, Vec<u64>)> = series.into_iter().collect();
    Ok(layout(
        "Budgets",
        html! {
            @if !c.settings.budgets_configured() {
                p.note { "No money budget is configured (usd_per_day, usd_per_month): spend is tracked for budgeted calls only." }
            }
            table.budgets {
                tr { th { "budget" } th { "name" } th { "per" } th { "ceiling" } th { "spent" } th { "of it reserved" } th { "used" } }
                @for b in &budgets { (rows_of(b)) }
            }
            h2 { "Spend per tenant per day (UTC)" }
            @if series.is_empty() {
                p { "Nothing spent under a tenant's budget in the last " (DAYS) " days." }
            } @else {
                (stacked_days(&labels, &series))
            }
            p.note { "Spent includes the reservations of calls in flight (their worst case), settled to each call's priced usage when its round trip is recorded." }
        },
    ))
}

fn rows_of(b: &BudgetUse) -> maud::Markup {
    let money = |u: Usd| u.to_string();
    html! {
        @for (period, ceiling, spent, reserved) in b.periods() {
            tr {
                td { (b.scope) } td { (b.name) } td { (period) } td { (money(ceiling)) }
                td { (money(spent)) } td { (money(reserved)) }
                td.used { (format!("{:.0} %", spent.micros() as f64 * 100.0 / ceiling.micros() as f64)) }
            }
        }
    }
}
