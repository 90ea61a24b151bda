//! The budgets part of `aptix status`: each budget's ceiling, and what is spent and reserved of
//! it this UTC day and month (docs/tenancy.md §7a).

use crate::budgets::BudgetUse;
use crate::config::{Settings, Usd};
use crate::store::Store;

/// Every configured budget with its use (none, without a database connection, when no budget
/// is configured).
pub async fn read(settings: &Settings) -> anyhow::Result<Vec<BudgetUse>> {
    if !settings.budgets_configured() {
        return Ok(Vec::new());
    }
    let store = Store::connect(settings.database.url.expose(), 1)?;
    Ok(crate::budgets::read(settings, &store).await?)
}

/// The budgets as a table: one line per budget and period it sets.
pub fn print(budgets: &[BudgetUse]) {
    if budgets.is_empty() {
        return;
    }
    let line = |a: &str, b: &str, c: &str, d: &str, e: &str, f: &str| {
        println!("{a:<8} {b:<24} {c:<6} {d:>14} {e:>14} {f:>14}");
    };
    line("budget", "name", "per", "ceiling", "spent", "of it reserved");
    for b in budgets {
        for (period, ceiling, spent, reserved) in b.periods() {
            let money = |u: Usd| u.to_string();
            let cells = (money(ceiling), money(spent), money(reserved));
            line(b.scope, &b.name, period, &cells.0, &cells.1, &cells.2);
        }
    }
}
