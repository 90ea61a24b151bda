//! The budgets part of `aptix status`: each budget's ceiling, and what is spent and reserved of
//! it this UTC day and month (docs/tenancy.md §7a).

use serde::Serialize;

use crate::config::{Budget, Settings, Usd};
use crate::store::{Spent, Store};

/// One budget and its use.
#[derive(Debug, Serialize)]
pub struct BudgetUse {
    /// `tenant` or `context`.
    pub scope: &'static str,
    /// The tenant's name or the context's id.
    pub name: String,
    /// Ceiling per UTC day (0: none).
    pub usd_per_day: Usd,
    /// Spent and reserved this UTC day.
    pub day: Usd,
    /// Ceiling per UTC month (0: none).
    pub usd_per_month: Usd,
    /// Spent and reserved this UTC month.
    pub month: Usd,
}

/// Every configured budget with its use, read from PostgreSQL.
pub async fn read(settings: &Settings) -> anyhow::Result<Vec<BudgetUse>> {
    if !settings.budgets_configured() {
        return Ok(Vec::new());
    }
    let store = Store::connect(settings.database.url.expose(), 1)?;
    let mut out = Vec::new();
    for tenant in settings.tenant_names() {
        let budget = settings.limits_of(Some(&tenant)).budget();
        if budget.is_set() {
            let spent = store.tenant_spend(&tenant).await?;
            out.push(one("tenant", tenant.to_string(), budget, spent));
        }
    }
    for (id, context) in &settings.conversation_contexts {
        if context.budget().is_set() {
            let spent = store.context_spend(id).await?;
            out.push(one("context", id.clone(), context.budget(), spent));
        }
    }
    Ok(out)
}

fn one(scope: &'static str, name: String, budget: Budget, spent: Spent) -> BudgetUse {
    BudgetUse {
        scope,
        name,
        usd_per_day: budget.per_day,
        day: spent.day,
        usd_per_month: budget.per_month,
        month: spent.month,
    }
}

/// The budgets as a table.
pub fn print(budgets: &[BudgetUse]) {
    if budgets.is_empty() {
        return;
    }
    println!(
        "{:<8} {:<24} {:>14} {:>14} {:>14} {:>14}",
        "budget", "name", "day", "of", "month", "of"
    );
    for b in budgets {
        let ceiling = |u: Usd| if u.is_zero() { "-".to_owned() } else { u.to_string() };
        println!(
            "{:<8} {:<24} {:>14} {:>14} {:>14} {:>14}",
            b.scope,
            b.name,
            b.day.to_string(),
            ceiling(b.usd_per_day),
            b.month.to_string(),
            ceiling(b.usd_per_month)
        );
    }
}
