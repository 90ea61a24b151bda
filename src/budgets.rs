//! Money budgets as people and monitors see them (docs/tenancy.md §7a): each configured budget
//! with what is spent of it this UTC day and month, read from PostgreSQL, for `aptix status`,
//! the console and the `aptix_budget_*` gauges, which a loop in every stage process refreshes.

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::{Budget, Settings, Usd};
use crate::store::{Spent, Store, StoreError};

/// How often the gauges are read again.
const EVERY: Duration = Duration::from_secs(15);

/// One budget and its use.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetUse {
    /// `tenant` or `context`.
    pub scope: &'static str,
    /// The tenant's name or the context's id.
    pub name: String,
    /// Its ceilings.
    #[serde(skip)]
    pub budget: Budget,
    /// What is spent of it, reservations of calls in flight included.
    #[serde(skip)]
    pub spent: Spent,
}

impl BudgetUse {
    /// Each period the budget sets a ceiling for: (`day` or `month`, ceiling, spent with
    /// reservations, of which reserved).
    pub fn periods(&self) -> impl Iterator<Item = (&'static str, Usd, Usd, Usd)> {
        let (b, s) = (&self.budget, &self.spent);
        [("day", b.per_day, s.day, s.open_day), ("month", b.per_month, s.month, s.open_month)]
            .into_iter()
            .filter(|(_, ceiling, _, _)| !ceiling.is_zero())
    }

    /// Sets its `aptix_budget_*` gauges, one series per period it sets.
    pub fn export(&self) {
        for (period, ceiling, spent, reserved) in self.periods() {
            let label = (self.scope, self.name.as_str(), period);
            let m = crate::metrics::metrics();
            m.budget(label, ceiling.micros_i64(), spent.micros_i64(), reserved.micros_i64());
        }
    }
}

/// Every configured budget with its use.
pub async fn read(settings: &Settings, store: &Store) -> Result<Vec<BudgetUse>, StoreError> {
    let mut out = Vec::new();
    if !settings.budgets_configured() {
        return Ok(out);
    }
    for tenant in settings.tenant_names() {
        let budget = settings.limits_of(Some(&tenant)).budget();
        if budget.is_set() {
            let spent = store.tenant_spend(&tenant).await?;
            out.push(BudgetUse { scope: "tenant", name: tenant.to_string(), budget, spent });
        }
    }
    for (id, context) in &settings.conversation_contexts {
        let budget = context.budget();
        if budget.is_set() {
            let spent = store.context_spend(id).await?;
            out.push(BudgetUse { scope: "context", name: id.clone(), budget, spent });
        }
    }
    Ok(out)
}

/// Keeps the `aptix_budget_*` gauges current until `shutdown`; returns at once when no budget
/// is configured.
pub async fn watch(settings: std::sync::Arc<Settings>, store: Store, shutdown: CancellationToken) {
    if !settings.budgets_configured() {
        return;
    }
    loop {
        match read(&settings, &store).await {
            Ok(budgets) => budgets.iter().for_each(BudgetUse::export),
            Err(error) => warn!(%error, "could not read budget use for the gauges"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}
